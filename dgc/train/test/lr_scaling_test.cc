// The learning-rate rule for the global batch (options.h): sqrt, linear and none, and its checks.
#include <gtest/gtest.h>

#include <cmath>

#include "dgc/core/error.h"
#include "dgc/train/options.h"

namespace dgc::train {
namespace {

TEST(LrScaling, FollowsTheGlobalBatchFromTheReference) {
  // The image task's rule: 0.1 at 4 workers x 32 (128).
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 128, 128), 0.1);
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 512, 128), 0.2);
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 2048, 128), 0.4);
  EXPECT_DOUBLE_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 1024, 128), 0.1 * std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 64, 128), 0.1 * std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(scaled_learning_rate(0.1, LrScaling::kLinear, 512, 128), 0.4);
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kNone, 512, 128), 0.1);
  // Only the global batch counts: 1 x 64 and 2 x 32 get the same rate.
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 1 * 64, 128),
            scaled_learning_rate(0.1, LrScaling::kSqrt, 2 * 32, 128));
}

TEST(LrScaling, StopsAtTheBatchLimit) {
  // The image task's default limit of 512: 16 x 32 and above run at 0.2.
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 512, 128, 512), 0.2);
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 1024, 128, 512), 0.2);
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 2048, 128, 512), 0.2);
  EXPECT_DOUBLE_EQ(scaled_learning_rate(0.1, LrScaling::kLinear, 2048, 128, 512), 0.4);
  // Below the limit, and with none (0), the rule as it is.
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 128, 128, 512), 0.1);
  EXPECT_DOUBLE_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 64, 128, 512), 0.1 * std::sqrt(0.5));
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kSqrt, 2048, 128, 0), 0.4);
  EXPECT_EQ(scaled_learning_rate(0.1, LrScaling::kNone, 2048, 128, 512), 0.1);
  EXPECT_THROW(scaled_learning_rate(0.1, LrScaling::kSqrt, 128, 128, -1), InvalidArgument);
}

TEST(LrScaling, NamesAndChecks) {
  for (auto s : {LrScaling::kNone, LrScaling::kSqrt, LrScaling::kLinear}) {
    EXPECT_EQ(parse_lr_scaling(to_string(s)), s);
  }
  EXPECT_THROW(parse_lr_scaling("log"), InvalidArgument);
  EXPECT_THROW(scaled_learning_rate(0.1, LrScaling::kSqrt, 0, 128), InvalidArgument);
  EXPECT_THROW(scaled_learning_rate(0.1, LrScaling::kSqrt, 128, 0), InvalidArgument);
}

}  // namespace
}  // namespace dgc::train
