// fp16 / bf16 conversions (float16.h) against brute-force nearest-value references.
#include "dgc/core/float16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace dgc {
namespace {

// All finite non-negative fp16 values, ascending, with their bit patterns.
struct HalfTable {
  std::vector<double> values;
  std::vector<uint16_t> bits;
  HalfTable() {
    for (uint32_t h = 0; h < 0x7C00; ++h) {
      bits.push_back(static_cast<uint16_t>(h));
      const int exponent = static_cast<int>(h >> 10);
      const int mantissa = static_cast<int>(h & 0x3FF);
      values.push_back(exponent == 0 ? std::ldexp(mantissa, -24)
                                     : std::ldexp(1024 + mantissa, exponent - 25));
    }
  }
};

// Round-to-nearest-even by search; finite values past the range saturate to 65504.
uint16_t reference_fp16(float x) {
  static const HalfTable table;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= table.values.back()) return sign | table.bits.back();
  const size_t hi = static_cast<size_t>(
      std::lower_bound(table.values.begin(), table.values.end(), a) - table.values.begin());
  if (table.values[hi] == a || hi == 0) return sign | table.bits[hi];
  const double below = a - table.values[hi - 1], above = table.values[hi] - a;
  if (below < above) return sign | table.bits[hi - 1];
  if (above < below) return sign | table.bits[hi];
  return sign | ((table.bits[hi] & 1) == 0 ? table.bits[hi] : table.bits[hi - 1]);
}

uint16_t reference_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t lo = bits & 0xFFFF0000u;
  const double a = std::fabs(static_cast<double>(x));
  const double down = std::fabs(static_cast<double>(std::bit_cast<float>(lo)));
  // Above the largest finite bf16 `up` is infinite, so the search keeps `lo`: saturation.
  const double up = std::fabs(static_cast<double>(std::bit_cast<float>(lo + 0x10000u)));
  const double below = a - down, above = up - a;
  uint32_t pick = lo;
  if (above < below || (above == below && ((lo >> 16) & 1) == 1)) pick = lo + 0x10000u;
  return static_cast<uint16_t>(pick >> 16);
}

TEST(Fp16, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = fp16_to_float(half);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(fp16_from_float(f))));
      continue;
    }
    ASSERT_EQ(fp16_from_float(f), half) << std::hex << h;
  }
  EXPECT_EQ(fp16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x7C00), std::numeric_limits<float>::infinity());
}

TEST(Fp16, RoundsToNearestEvenLikeTheSearch) {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 300000; ++i) {
    float x = std::ldexp(mantissa(rng), exponent(rng));
    if (i % 2) x = -x;
    ASSERT_EQ(fp16_from_float(x), reference_fp16(x)) << x;
  }
  // Every exact midpoint between neighbouring halves (ties), and the neighbours of midpoints.
  const HalfTable table;
  for (size_t i = 0; i + 1 < table.values.size(); ++i) {
    const float mid = static_cast<float>(0.5 * (table.values[i] + table.values[i + 1]));
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ASSERT_EQ(fp16_from_float(x), reference_fp16(x)) << x;
    }
  }
}

TEST(Fp16, SaturatesFiniteAndKeepsSpecials) {
  EXPECT_EQ(fp16_from_float(65519.99f), 0x7BFF);
  EXPECT_EQ(fp16_from_float(65520.0f), 0x7BFF);
  EXPECT_EQ(fp16_from_float(1e30f), 0x7BFF);
  EXPECT_EQ(fp16_from_float(-1e30f), 0xFBFF);
  EXPECT_EQ(fp16_from_float(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(fp16_from_float(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(std::isnan(fp16_to_float(fp16_from_float(std::nanf("")))));
  EXPECT_EQ(fp16_from_float(1e-9f), 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(fp16_from_float(-0.0f), 0x8000);
}

TEST(Bf16, RoundsToNearestEvenAndSaturates) {
  std::mt19937_64 rng(2);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  for (int i = 0; i < 300000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(bf16_from_float(x), reference_bf16(x)) << x;
  }
  EXPECT_EQ(bf16_from_float(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()), 0x7F7F);
  EXPECT_EQ(bf16_from_float(-std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float(std::nanf("")))));
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(bf16_from_float(f), b);
    }
  }
}

}  // namespace
}  // namespace dgc
