// Momentum correction and momentum factor masking (momentum.h) against reference.h.
#include "dgc/core/momentum.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "dgc/core/error.h"
#include "dgc/core/test/reference.h"

namespace dgc {
namespace {

class AccumulateTest : public ::testing::TestWithParam<std::tuple<size_t, bool>> {};

TEST_P(AccumulateTest, MatchesReferenceBitForBitOverSteps) {
  const auto [n, nesterov] = GetParam();
  MomentumOptions options;
  options.nesterov = nesterov;
  std::vector<float> u(n, 0.0f), v(n, 0.0f), ref_u(n, 0.0f), ref_v(n, 0.0f);
  for (uint64_t step = 0; step < 4; ++step) {
    const std::vector<float> g = test::normal_values(n, 100 + step);
    accumulate_velocity(u, v, g, options);
    test::reference_accumulate(ref_u, ref_v, g, options);
  }
  EXPECT_EQ(u, ref_u);
  EXPECT_EQ(v, ref_v);
}

INSTANTIATE_TEST_SUITE_P(Sizes, AccumulateTest,
                         ::testing::Combine(::testing::Values(0, 1, 3, 17, 64, 1000, 100003),
                                            ::testing::Bool()));

TEST(Accumulate, PlainAndNesterovFormulas) {
  MomentumOptions options;
  options.factor = 0.5;
  std::vector<float> u = {2.0f}, v = {1.0f};
  const std::vector<float> g = {4.0f};
  accumulate_velocity(u, v, g, options);  // u = 0.5*2 + 4 = 5; v = 1 + 5 = 6
  EXPECT_EQ(u[0], 5.0f);
  EXPECT_EQ(v[0], 6.0f);
  options.nesterov = true;
  u = {2.0f};
  v = {1.0f};
  accumulate_velocity(u, v, g, options);  // u = 0.5*(2 + 4) = 3; v = 1 + 3 + 4 = 8
  EXPECT_EQ(u[0], 3.0f);
  EXPECT_EQ(v[0], 8.0f);
}

TEST(Accumulate, RejectsMismatchedLengths) {
  std::vector<float> u(3), v(3), g(4);
  EXPECT_THROW(accumulate_velocity(u, v, g, MomentumOptions{}), InvalidArgument);
  std::vector<float> short_u(2);
  EXPECT_THROW(accumulate_velocity(short_u, v, std::vector<float>(3), MomentumOptions{}),
               InvalidArgument);
}

TEST(MaskSent, SubtractsSentValueAndZeroesMomentum) {
  std::vector<float> u = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> v = {10.0f, 20.0f, 30.0f, 40.0f};
  const std::vector<uint32_t> indices = {3, 1};    // any order
  const std::vector<float> sent = {40.0f, 19.5f};  // e.g. rounded on the wire
  mask_sent(u, v, indices, sent, MomentumOptions{});
  EXPECT_EQ(v, (std::vector<float>{10.0f, 0.5f, 30.0f, 0.0f}));
  EXPECT_EQ(u, (std::vector<float>{1.0f, 0.0f, 3.0f, 0.0f}));
}

TEST(MaskSent, WithoutMaskingKeepsMomentum) {
  std::vector<float> u = {1.0f, 2.0f};
  std::vector<float> v = {10.0f, 20.0f};
  MomentumOptions options;
  options.masking = false;
  const std::vector<uint32_t> indices = {0};
  const std::vector<float> sent = {10.0f};
  mask_sent(u, v, indices, sent, options);
  EXPECT_EQ(v, (std::vector<float>{0.0f, 20.0f}));
  EXPECT_EQ(u, (std::vector<float>{1.0f, 2.0f}));
}

TEST(MaskSent, RejectsOutOfRangeIndexAndCountMismatch) {
  std::vector<float> u(4), v(4);
  const std::vector<uint32_t> bad = {4};
  const std::vector<float> one = {1.0f};
  EXPECT_THROW(mask_sent(u, v, bad, one, MomentumOptions{}), InvalidArgument);
  const std::vector<uint32_t> two = {0, 1};
  EXPECT_THROW(mask_sent(u, v, two, one, MomentumOptions{}), InvalidArgument);
}

}  // namespace
}  // namespace dgc
