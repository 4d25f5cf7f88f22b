// The byte layout of a DGC message (codec.h), shared by the codec's writer (codec.cc), its
// validation (codec_validate.cc) and its decoding (codec_decode.cc). Private to dgc::core.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dgc/core/bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"

namespace dgc::codec_format {

inline constexpr uint8_t kMagic[4] = {'D', 'G', 'C', '1'};
inline constexpr size_t kHeaderBytes = kMessageHeaderBytes;
inline constexpr size_t kRunIdOffset = 28;
inline constexpr size_t kHeaderCrcOffset = 44;  // the header crc covers bytes [0, 44)
inline size_t value_bytes(ValueType type) { return type == ValueType::kFloat32 ? 4 : 2; }

inline bool known_value_type(uint8_t type) {
  return type <= static_cast<uint8_t>(ValueType::kBFloat16);
}

[[noreturn]] inline void fail(DecodeError::Reason reason, const std::string& what) {
  throw DecodeError(reason, "invalid DGC message: " + what);
}

inline float load_value(const uint8_t* p, ValueType type) {
  switch (type) {
    case ValueType::kFloat32:
      return std::bit_cast<float>(load_le<uint32_t>(p));
    case ValueType::kFloat16:
      return fp16_to_float(load_le<uint16_t>(p));
    case ValueType::kBFloat16:
      return bf16_to_float(load_le<uint16_t>(p));
  }
  return 0.0f;
}

}  // namespace dgc::codec_format
