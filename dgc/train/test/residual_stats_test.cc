// ResidualStats: the ages, the never-sent fraction and the masses it reports, on hand-made
// selections of a two-tensor compressor.
#include "dgc/train/residual_stats.h"

#include <gtest/gtest.h>

namespace dgc::train {
namespace {

Selection sent(std::vector<uint32_t> indices, std::vector<float> values) {
  Selection s;
  s.indices = std::move(indices);
  s.values = std::move(values);
  return s;
}

TEST(ResidualStats, AgesCountFromTheLastSendOrTheFirstStep) {
  CompressionOptions options;
  Compressor compressor({4, 6, 3}, options);
  ResidualStats stats(compressor, 2);  // the third tensor (a dense-path group) is left out
  // Step 0: tensor 0 sends element 1 (age 1: waited one step), tensor 1 nothing.
  std::vector<Selection> step0 = {sent({1}, {2.0f}), sent({}, {}), sent({0, 1, 2}, {9, 9, 9})};
  stats.record(0, step0);
  // Step 4: tensor 0 sends element 1 again (age 4) and element 3 (age 5), tensor 1 element 5.
  std::vector<Selection> step4 = {sent({1, 3}, {-1.0f, 0.5f}), sent({5}, {-0.5f})};
  stats.record(4, step4);
  compressor.velocity(0)[0] = 3.0f;
  compressor.velocity(1)[2] = -1.0f;
  compressor.velocity(2)[0] = 100.0f;  // not counted
  const ResidualEpochStats e = stats.take(compressor);
  EXPECT_DOUBLE_EQ(e.sent_age_mean, (1.0 + 4.0 + 5.0 + 5.0) / 4.0);
  EXPECT_DOUBLE_EQ(e.sent_age_p90, 5.0);
  EXPECT_DOUBLE_EQ(e.never_sent_fraction, 7.0 / 10.0);  // 3 of the 10 elements were sent
  EXPECT_DOUBLE_EQ(e.residual_l1, 4.0);
  EXPECT_DOUBLE_EQ(e.sent_l1, 2.0 + 1.0 + 0.5 + 0.5);
  EXPECT_DOUBLE_EQ(e.residual_epochs, 1.0);

  // The next epoch starts its sums afresh; what was sent stays sent.
  std::vector<Selection> step6 = {sent({1}, {1.0f}), sent({}, {})};
  stats.record(6, step6);
  const ResidualEpochStats next = stats.take(compressor);
  EXPECT_DOUBLE_EQ(next.sent_age_mean, 2.0);
  EXPECT_DOUBLE_EQ(next.sent_l1, 1.0);
  EXPECT_DOUBLE_EQ(next.never_sent_fraction, 7.0 / 10.0);
}

TEST(ResidualStats, AnEpochWithoutSendsReportsZeros) {
  Compressor compressor({5}, CompressionOptions{});
  ResidualStats stats(compressor, 1);
  const ResidualEpochStats e = stats.take(compressor);
  EXPECT_EQ(e.sent_age_mean, 0.0);
  EXPECT_EQ(e.residual_epochs, 0.0);
  EXPECT_EQ(e.never_sent_fraction, 1.0);
}

}  // namespace
}  // namespace dgc::train
