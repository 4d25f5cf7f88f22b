// Conversions between fp32 and the 16-bit wire formats (IEEE fp16 and bfloat16).
//
// Rounding is round-to-nearest-even. Finite values beyond the range of the 16-bit format
// saturate to its largest finite value instead of becoming infinite, so a large velocity is sent
// as the largest representable value and the rest stays in the residual. NaN stays NaN and
// infinities stay infinite. Pure functions; thread-safe.
#pragma once

#include <bit>
#include <cstdint>

namespace dgc {

inline uint16_t fp16_from_float(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // NaN or infinity
    return sign | (magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u);
  }
  if (magnitude >= 0x477FF000u) return sign | 0x7BFFu;  // >= 65520 rounds past 65504: saturate
  if (magnitude < 0x38800000u) {                        // below 2^-14: fp16 subnormal or zero
    // Adding 0.5 aligns the value to a multiple of 2^-24 with the FPU's round-to-nearest-even.
    const float aligned = std::bit_cast<float>(magnitude) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(aligned) - 0x3F000000u);
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xC8000FFFu + odd;  // rebias exponent (15 - 127) and round to nearest even
  return sign | static_cast<uint16_t>(magnitude >> 13);
}

inline float fp16_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1Fu;
  const uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t bf16_from_float(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  if (magnitude == 0x7F800000u) return static_cast<uint16_t>(bits >> 16);             // infinity
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  if ((rounded & 0x7F80u) == 0x7F80u) {  // a finite value rounded up to infinity: saturate
    return static_cast<uint16_t>((bits >> 16) & 0x8000u) | 0x7F7Fu;
  }
  return static_cast<uint16_t>(rounded);
}

inline float bf16_to_float(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

}  // namespace dgc
