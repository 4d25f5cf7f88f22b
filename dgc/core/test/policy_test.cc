// Which tensors are compressed (policy.h).
#include "dgc/core/policy.h"

#include <gtest/gtest.h>

#include <vector>

#include "dgc/core/error.h"

namespace dgc {
namespace {

TensorPath path(std::vector<int64_t> shape, const PolicyOptions& options = {}) {
  return choose_path(shape, options);
}

TEST(Policy, OneDimensionalTensorsGoDense) {
  EXPECT_EQ(path({4096}), TensorPath::kDense);  // a large bias / norm parameter
  EXPECT_EQ(path({1 << 20}), TensorPath::kDense);
}

TEST(Policy, SmallTensorsGoDense) {
  EXPECT_EQ(path({16, 63}), TensorPath::kDense);  // 1008 < 1024
  EXPECT_EQ(path({3, 3, 3, 3}), TensorPath::kDense);
  EXPECT_EQ(path({}), TensorPath::kDense);  // a scalar
}

TEST(Policy, LargeMultiDimensionalTensorsAreCompressed) {
  EXPECT_EQ(path({16, 64}), TensorPath::kCompressed);  // exactly 1024
  EXPECT_EQ(path({64, 3, 7, 7}), TensorPath::kCompressed);
  EXPECT_EQ(path({1000, 2048}), TensorPath::kCompressed);
  EXPECT_EQ(path({1, 4096}), TensorPath::kCompressed);  // more than one dimension, even if 1
}

TEST(Policy, SettingsMoveTheCutOff) {
  PolicyOptions options;
  options.min_numel = 10;
  EXPECT_EQ(path({2, 5}, options), TensorPath::kCompressed);
  EXPECT_EQ(path({3, 3}, options), TensorPath::kDense);
  options.compress_1d = true;
  EXPECT_EQ(path({4096}, options), TensorPath::kCompressed);
  EXPECT_EQ(path({9}, options), TensorPath::kDense);
  options.min_numel = 0;
  EXPECT_EQ(path({0, 5}, options), TensorPath::kCompressed);  // empty, but the rule is the rule
}

TEST(Policy, NegativeDimensionIsRejected) { EXPECT_THROW(path({-1, 5}), InvalidArgument); }

}  // namespace
}  // namespace dgc
