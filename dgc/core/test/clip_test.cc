// Local gradient clipping (clip.h).
#include "dgc/core/clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dgc/core/error.h"
#include "dgc/core/test/reference.h"

namespace dgc {
namespace {

TEST(SquaredNorm, MatchesDoubleSum) {
  for (size_t n : {0, 1, 3, 4, 5, 1001}) {
    const std::vector<float> x = test::normal_values(n, n);
    double expected = 0.0;
    for (float value : x) expected += static_cast<double>(value) * value;
    EXPECT_NEAR(squared_norm(x), expected, 1e-12 * (1.0 + expected)) << n;
  }
  const std::vector<float> x = {3.0f, 4.0f};
  EXPECT_EQ(squared_norm(x), 25.0);
}

TEST(SquaredNorm, NonFiniteGradientGivesNonFiniteNorm) {
  std::vector<float> x = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  EXPECT_FALSE(std::isfinite(squared_norm(x)));
  x[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(squared_norm(x)));
}

TEST(ClipCoefficient, ThresholdScalesWithInverseSqrtOfWorldSize) {
  // norm 10, max_norm 8: one worker clips to 8/10; four workers to (8/2)/10.
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 8.0, 1), 0.8);
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 8.0, 4), 0.4);
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 8.0, 16), 0.2);
  // Below the threshold: untouched.
  EXPECT_EQ(clip_coefficient(1.0, 8.0, 4), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 8.0, 4), 1.0);
  // Disabled.
  EXPECT_EQ(clip_coefficient(1e12, 0.0, 4), 1.0);
  EXPECT_EQ(clip_coefficient(1e12, -1.0, 4), 1.0);
}

TEST(ClipCoefficient, NonFiniteNormThrowsNumericError) {
  EXPECT_THROW(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0, 1), NumericError);
  EXPECT_THROW(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0, 1), NumericError);
  // Even with clipping disabled: a NaN gradient is an error either way.
  EXPECT_THROW(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 0.0, 1), NumericError);
  EXPECT_THROW(clip_coefficient(1.0, 1.0, 0), InvalidArgument);
}

TEST(Clip, ClippedGradientsHaveTheScaledNorm) {
  // Two tensors of one worker, clipped together by their joint norm.
  std::vector<float> a = test::normal_values(1000, 1), b = test::normal_values(300, 2);
  const double total = squared_norm(a) + squared_norm(b);
  const double max_norm = 5.0;
  const int workers = 4;
  const double c = clip_coefficient(total, max_norm, workers);
  ASSERT_LT(c, 1.0);
  scale(a, static_cast<float>(c));
  scale(b, static_cast<float>(c));
  EXPECT_NEAR(std::sqrt(squared_norm(a) + squared_norm(b)), max_norm / 2.0, 1e-5);
}

TEST(Clip, ScaleMultipliesInPlace) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f};
  scale(x, 0.5f);
  EXPECT_EQ(x, (std::vector<float>{0.5f, -1.0f, 0.25f}));
}

}  // namespace
}  // namespace dgc
