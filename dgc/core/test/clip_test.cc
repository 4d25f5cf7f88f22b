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

TEST(ClipCoefficient, ClipsToTheLimit) {
  // norm 10: a limit of 8 scales by 0.8, a limit of 4 by 0.4.
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 8.0), 0.8);
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 4.0), 0.4);
  // Below the limit: untouched.
  EXPECT_EQ(clip_coefficient(1.0, 8.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 8.0), 1.0);
  // Disabled.
  EXPECT_EQ(clip_coefficient(1e12, 0.0), 1.0);
  EXPECT_EQ(clip_coefficient(1e12, -1.0), 1.0);
}

TEST(LocalClipLimit, PaperScalingBoundsEachWorkersShareOfTheSum) {
  // The paper clips g / N at max_norm / sqrt(N): on g that is max_norm * sqrt(N).
  for (int n : {1, 4, 16}) {
    const double limit = local_clip_limit(8.0, n, ClipScaling::kPaper);
    EXPECT_DOUBLE_EQ(limit / n, 8.0 / std::sqrt(static_cast<double>(n))) << n << " workers";
  }
  EXPECT_DOUBLE_EQ(local_clip_limit(8.0, 4, ClipScaling::kPaper), 16.0);
}

TEST(LocalClipLimit, MeanScalingBoundsTheMeanGradient) {
  EXPECT_DOUBLE_EQ(local_clip_limit(8.0, 1, ClipScaling::kMeanGradient), 8.0);
  EXPECT_DOUBLE_EQ(local_clip_limit(8.0, 4, ClipScaling::kMeanGradient), 4.0);
  EXPECT_DOUBLE_EQ(local_clip_limit(8.0, 16, ClipScaling::kMeanGradient), 2.0);
}

TEST(LocalClipLimit, OffAndBadInput) {
  EXPECT_EQ(local_clip_limit(0.0, 4, ClipScaling::kPaper), 0.0);
  EXPECT_EQ(local_clip_limit(-1.0, 4, ClipScaling::kMeanGradient), 0.0);
  EXPECT_THROW(local_clip_limit(1.0, 0, ClipScaling::kPaper), InvalidArgument);
  EXPECT_EQ(parse_clip_scaling("paper"), ClipScaling::kPaper);
  EXPECT_EQ(parse_clip_scaling("mean"), ClipScaling::kMeanGradient);
  EXPECT_EQ(to_string(ClipScaling::kMeanGradient), "mean");
  EXPECT_THROW(parse_clip_scaling("sqrt"), InvalidArgument);
}

TEST(ClipCoefficient, NonFiniteNormThrowsNumericError) {
  EXPECT_THROW(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0), NumericError);
  EXPECT_THROW(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), NumericError);
  // Even with clipping disabled: a NaN gradient is an error either way.
  EXPECT_THROW(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 0.0), NumericError);
}

TEST(Clip, ClippedGradientsHaveTheScaledNorm) {
  // Two tensors of one worker, clipped together by their joint norm.
  std::vector<float> a = test::normal_values(1000, 1), b = test::normal_values(300, 2);
  const double total = squared_norm(a) + squared_norm(b);
  const double limit = local_clip_limit(5.0, 4, ClipScaling::kMeanGradient);
  const double c = clip_coefficient(total, limit);
  ASSERT_LT(c, 1.0);
  scale(a, static_cast<float>(c));
  scale(b, static_cast<float>(c));
  EXPECT_NEAR(std::sqrt(squared_norm(a) + squared_norm(b)), 5.0 / 2.0, 1e-5);
}

TEST(Clip, ScaleMultipliesInPlace) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f};
  scale(x, 0.5f);
  EXPECT_EQ(x, (std::vector<float>{0.5f, -1.0f, 0.25f}));
}

}  // namespace
}  // namespace dgc
