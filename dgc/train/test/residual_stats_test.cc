// ResidualStats: the ages, the never-sent fraction, the masses and the overlap of the selections
// across ranks it reports, on hand-made selections of a two-tensor compressor.
#include "dgc/train/residual_stats.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/comm/launch.h"
#include "dgc/train/step.h"

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

// The exchange's written positions of one tensor when `ranks` select these indices: each
// position once per rank, in rank order (Exchange::last_written with allgather).
std::vector<uint64_t> written_by(const std::vector<std::vector<uint32_t>>& ranks) {
  std::vector<uint64_t> out;
  for (const auto& r : ranks) out.insert(out.end(), r.begin(), r.end());
  return out;
}

TEST(ResidualStats, OverlapIsOneForIdenticalAndZeroForDisjointSelections) {
  Compressor compressor({8, 6}, CompressionOptions{});
  ResidualStats stats(compressor, 2);
  // Three ranks select the same indices: every one of rank 0's is shared, by every rank.
  std::vector<Selection> mine = {sent({1, 4, 7}, {1, 1, 1}), sent({0}, {1})};
  auto w0 = written_by({{1, 4, 7}, {1, 4, 7}, {1, 4, 7}});
  auto w1 = written_by({{0}, {0}, {0}});
  std::vector<std::span<const uint64_t>> written = {w0, w1};
  stats.record_overlap(mine, written, 3);
  ResidualEpochStats e = stats.take(compressor);
  ASSERT_TRUE(e.selection_overlap.has_value());
  EXPECT_DOUBLE_EQ(*e.selection_overlap, 1.0);
  EXPECT_DOUBLE_EQ(*e.selection_shared_all, 1.0);

  // Disjoint selections: none shared (the counts of the step before were reset).
  w0 = written_by({{1, 4, 7}, {0, 2}, {3, 5}});
  w1 = written_by({{0}, {1}, {2, 3}});
  written = {w0, w1};
  stats.record_overlap(mine, written, 3);
  e = stats.take(compressor);
  EXPECT_DOUBLE_EQ(*e.selection_overlap, 0.0);
  EXPECT_DOUBLE_EQ(*e.selection_shared_all, 0.0);
}

TEST(ResidualStats, OverlapCountsIndicesSharedWithAnyOrEveryOtherRank) {
  Compressor compressor({8, 6, 4}, CompressionOptions{});
  ResidualStats stats(compressor, 2);  // the third tensor is left out
  // Rank 0 selects {0, 1, 2, 3} and {5}; rank 1 {1, 6} and {5}; rank 2 {1, 2} and nothing.
  std::vector<Selection> mine = {sent({0, 1, 2, 3}, {1, 1, 1, 1}), sent({5}, {1}),
                                 sent({0, 1, 2, 3}, {1, 1, 1, 1})};
  const auto w0 = written_by({{0, 1, 2, 3}, {1, 6}, {1, 2}});
  const auto w1 = written_by({{5}, {5}, {}});
  const auto w2 = written_by({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}});
  std::vector<std::span<const uint64_t>> written = {w0, w1, w2};
  stats.record_overlap(mine, written, 3);
  // A second step in the same epoch: rank 0's {2} shared with rank 1 only.
  std::vector<Selection> next = {sent({2}, {1}), sent({}, {})};
  const auto v0 = written_by({{2}, {2}, {7}});
  const std::vector<uint64_t> v1;
  written = {v0, v1};
  stats.record_overlap(next, written, 3);
  const ResidualEpochStats e = stats.take(compressor);
  // Shared: 1, 2 and 5 of the first step, 2 of the second; by every rank: 1.
  EXPECT_DOUBLE_EQ(*e.selection_overlap, 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(*e.selection_shared_all, 1.0 / 6.0);
}

TEST(ResidualStats, NoOverlapWithOneRankOrWithoutCounts) {
  Compressor compressor({4}, CompressionOptions{});
  ResidualStats stats(compressor, 1);
  std::vector<Selection> mine = {sent({1}, {1})};
  const auto w = written_by({{1}});
  const std::vector<std::span<const uint64_t>> written = {w};
  stats.record_overlap(mine, written, 1);
  EXPECT_FALSE(stats.take(compressor).selection_overlap.has_value());
  EXPECT_FALSE(stats.take(compressor).selection_shared_all.has_value());
}

// Through the real exchange (3 ranks, record_selection_overlap as the trainer calls it): the same
// gradient on every rank gives overlap 1, gradients on disjoint positions give 0, and
// sparse-allreduce (which does not list a position once per rank) gives none.
enum class Gradients { kIdentical, kDisjoint };

std::optional<double> overlap_through_exchange(Gradients gradients, ExchangeAlgorithm algorithm,
                                               std::optional<double>* shared_all) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"w", {20, 30}},
                                                                            {"b", {6}}};
  OptimizerOptions options;
  options.exchange = algorithm;
  options.policy.min_numel = 100;  // w compressed, b dense
  options.density = {.after_warmup = 0.02, .warmup_epochs = 0.0, .iterations_per_stage = 0};
  options.iterations_per_epoch = 3;
  std::optional<double> overlap;
  comm::GlooOptions gloo;
  gloo.timeout = std::chrono::seconds(30);
  comm::run_local(3, gloo, [&](comm::Communicator& comm) {
    DistributedStep step(comm, shapes, options);
    std::unique_ptr<ResidualStats> stats;
    if (comm.rank() == 0) stats = std::make_unique<ResidualStats>(*step.compressor(), 1);
    std::vector<float> w(600, 0.0f), b(6, 0.0f), dw(600), db(6);
    for (int s = 0; s < 3; ++s) {
      // Twelve elements of magnitude 1 per rank, the rest 0: identical positions on every
      // rank, or positions no other rank has.
      std::vector<float> gw(600, 0.0f), gb(6, 0.5f);
      for (size_t e = 0; e < 12; ++e) {
        const size_t at = gradients == Gradients::kIdentical
                              ? 50 * e + static_cast<size_t>(s)
                              : 50 * e + 3 * static_cast<size_t>(s) + comm.rank() * 10;
        gw[at] = e % 2 == 0 ? 1.0f : -1.0f;
      }
      std::vector<std::span<float>> grads = {gw, gb};
      std::vector<std::span<const float>> weights = {w, b};
      std::vector<std::span<float>> dirs = {dw, db};
      ASSERT_TRUE(step.run(grads, weights, dirs));
      if (stats) record_selection_overlap(step, *stats);
    }
    if (stats) {
      const ResidualEpochStats e = stats->take(*step.compressor());
      overlap = e.selection_overlap;
      *shared_all = e.selection_shared_all;
    }
  });
  return overlap;
}

TEST(ResidualStats, OverlapThroughTheExchange) {
  std::optional<double> all;
  const auto identical =
      overlap_through_exchange(Gradients::kIdentical, ExchangeAlgorithm::kAllgather, &all);
  ASSERT_TRUE(identical.has_value());
  EXPECT_DOUBLE_EQ(*identical, 1.0);
  EXPECT_DOUBLE_EQ(*all, 1.0);
  const auto disjoint =
      overlap_through_exchange(Gradients::kDisjoint, ExchangeAlgorithm::kDirect, &all);
  ASSERT_TRUE(disjoint.has_value());
  EXPECT_DOUBLE_EQ(*disjoint, 0.0);
  EXPECT_DOUBLE_EQ(*all, 0.0);
  EXPECT_FALSE(
      overlap_through_exchange(Gradients::kIdentical, ExchangeAlgorithm::kSparseAllreduce, &all)
          .has_value());
}

}  // namespace
}  // namespace dgc::train
