// The DGC exchange with ranks as threads (run_local), for every algorithm (allgather, direct,
// sparse-allreduce): the exchanged updates equal the reference (reference.h: the direct sum over
// ranks of what was applied / N) for world sizes 1..8 and uniform, skewed, colliding, disjoint
// and empty selections, dense path too; selected = applied + returned per rank; the byte
// accounting has its closed form; the handshake names every kind of mismatch (the algorithm
// included); a corrupt message names its sender; a stalled rank is an error within the timeout.
#include "dgc/exchange/exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>

#include "dgc/comm/launch.h"
#include "dgc/comm/wire_bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/compressor.h"
#include "dgc/core/error.h"
#include "dgc/exchange/reference.h"
#include "dgc/exchange/sparse_allreduce.h"
#include "dgc/exchange/test/exchange_fixture.h"

namespace dgc {
namespace {

using std::chrono::milliseconds;
using test::model_layout;
using test::Pattern;
using test::rank_inputs;

comm::GlooOptions quick() {
  comm::GlooOptions options;
  options.timeout = milliseconds(10000);
  return options;
}

// Only compressed tensors: no dense-path allreduce.
std::vector<TensorSpec> compressed_only_layout() {
  PolicyOptions policy;
  policy.min_numel = 1024;
  return make_layout({{"conv.weight", {16, 8, 3, 3}}, {"fc.weight", {10, 300}}}, policy);
}

ExchangeOptions exchange_options(ValueType type = ValueType::kFloat32) {
  ExchangeOptions options;
  options.value_type = type;
  options.timeout = milliseconds(10000);
  options.settings = "density=0.001\nmomentum=0.9\n";
  return options;
}

// The size of every rank's message at `iteration`, encoded here the way the exchange does
// (the two compressed tensors of 1152 and 3000 elements).
std::vector<uint64_t> encoded_sizes(const std::vector<TensorSpec>& layout, int n,
                                    uint64_t iteration, ValueType type) {
  std::vector<uint64_t> sizes(n);
  for (int r = 0; r < n; ++r) {
    const auto in = rank_inputs(layout, r, iteration);
    MessageWriter writer(type, iteration);
    writer.add(0, 1152, in.selections[0].indices, in.selections[0].values);
    writer.add(1, 3000, in.selections[1].indices, in.selections[1].values);
    std::vector<uint8_t> message;
    writer.finish(message);
    sizes[r] = message.size();
  }
  return sizes;
}

TEST(Layout, PolicyChoosesThePathAndKeepsTheOrder) {
  const auto layout = model_layout();
  ASSERT_EQ(layout.size(), 5u);
  EXPECT_EQ(layout[0].name, "conv.weight");
  EXPECT_EQ(layout[0].numel(), 1152);
  EXPECT_EQ(layout[0].path, TensorPath::kCompressed);
  EXPECT_EQ(layout[1].path, TensorPath::kDense);
  EXPECT_EQ(layout[2].path, TensorPath::kCompressed);
  EXPECT_EQ(layout[3].path, TensorPath::kDense);
  EXPECT_EQ(layout[4].path, TensorPath::kDense);
  const TensorSpec scalar{"scalar", {}, TensorPath::kDense};
  EXPECT_EQ(scalar.numel(), 1);
}

// ---- the exchange over world sizes, value types ----

struct Case {
  int world_size;
  ValueType value_type;
  ExchangeAlgorithm algorithm;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << to_string(c.algorithm) << ", N = " << c.world_size << ", " << to_string(c.value_type);
}

ExchangeOptions options_for(const Case& c) {
  ExchangeOptions options = exchange_options(c.value_type);
  options.algorithm = c.algorithm;
  options.rebalance_interval = 2;  // re-balance within the few iterations of a test
  return options;
}

// Runs iteration `it` on this rank and checks the outputs against the reference (reference.h):
// the update is the direct sum over ranks of what was applied / N, the unapplied hand-back is
// consistent over ranks, and the dense part is the average. Returns this rank's unapplied.
std::vector<Selection> run_checked(comm::Communicator& comm, Exchange& exchange,
                                   const std::vector<TensorSpec>& layout, uint64_t it,
                                   Pattern pattern, std::vector<std::vector<float>>& updates,
                                   ValueType type) {
  const int n = comm.size();
  auto in = rank_inputs(layout, comm.rank(), it, pattern);
  std::vector<Selection> unapplied(in.selections.size());
  const int flagged =
      exchange.run(it, in.selections, test::spans(updates), in.dense, true, unapplied);
  EXPECT_EQ(flagged, 0);
  const auto all_unapplied = test::gather_unapplied(comm, unapplied);
  const auto expected = test::expected_result(layout, n, it, pattern);
  for (size_t c = 0; c < updates.size(); ++c) {
    std::vector<Selection> selected, back;
    for (int r = 0; r < n; ++r) {
      selected.push_back(rank_inputs(layout, r, it, pattern).selections[c]);
      back.push_back(all_unapplied[r][c]);
    }
    const ReferenceCheck check = check_update(selected, back, updates[c], type);
    EXPECT_TRUE(check.ok()) << "rank " << comm.rank() << " tensor " << c << " iteration " << it
                            << " (" << pattern_name(pattern) << "): " << check.mismatches
                            << " problem(s), the first: " << check.first;
    if (exchange.algorithm() != ExchangeAlgorithm::kSparseAllreduce) {
      EXPECT_EQ(check.returned, 0u);
    }
  }
  for (size_t j = 0; j < expected.dense.size(); ++j) {
    EXPECT_NEAR(in.dense[j], expected.dense[j], 1e-6) << "dense element " << j;
  }
  return unapplied;
}

class ExchangeTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExchangeTest, UpdatesAreTheDirectSumOfWhatWasAppliedForEveryIndexPattern) {
  const Case c = GetParam();
  const int n = c.world_size;
  for (const auto& layout : {model_layout(), compressed_only_layout()}) {
    std::mutex mutex;
    std::vector<std::vector<std::vector<float>>> results(n);  // rank -> tensor -> values
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      Exchange exchange(comm, layout, options_for(c));
      EXPECT_NE(exchange.algorithm(), ExchangeAlgorithm::kAuto);
      std::vector<std::vector<float>> updates = {std::vector<float>(1152, 99.0f),
                                                 std::vector<float>(3000, 99.0f)};
      uint64_t it = 0;
      for (const Pattern pattern : {Pattern::kColliding, Pattern::kUniform, Pattern::kSkewed,
                                    Pattern::kDisjoint, Pattern::kEmpty}) {
        for (int repeat = 0; repeat < 2; ++repeat) {
          run_checked(comm, exchange, layout, it++, pattern, updates, c.value_type);
        }
      }
      std::lock_guard lock(mutex);
      results[comm.rank()] = updates;
    });
    // Every rank decodes the same messages in the same order: identical bits everywhere.
    for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r;
  }
}

TEST_P(ExchangeTest, BytesHaveTheirClosedForm) {
  const Case c = GetParam();
  if (c.algorithm == ExchangeAlgorithm::kSparseAllreduce) {
    GTEST_SKIP() << "the sparse allreduce's volume depends on the reduction (see SparseVolume)";
  }
  const int n = c.world_size;
  const auto layout = model_layout();
  const uint64_t dense_numel = 16 + 10 + 16;
  const uint64_t total_numel = 1152 + 3000 + dense_numel;
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, options_for(c));
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    ExchangeBytes sum;
    for (uint64_t it = 0; it < 2; ++it) {
      // Every rank's message, encoded here the way the exchange does.
      const std::vector<uint64_t> sizes = encoded_sizes(layout, n, it, c.value_type);
      auto in = rank_inputs(layout, comm.rank(), it);
      exchange.run(it, in.selections, test::spans(updates), in.dense);
      const auto& b = exchange.last();
      EXPECT_EQ(b.message, sizes[comm.rank()] + 4 * dense_numel);
      EXPECT_EQ(b.dense_gradient, 4 * total_numel);
      comm::ByteCounters sparse;
      if (c.algorithm == ExchangeAlgorithm::kDirect) {
        // This rank's message to every other rank, every other rank's to this one.
        const std::vector<uint64_t> mine(n, sizes[comm.rank()]);
        sparse = comm::direct_alltoallv_bytes(mine, sizes, comm.rank());
      } else {
        sparse = comm::ring_allgatherv_bytes(sizes, comm.rank());
        const uint64_t size_exchange = n > 1 ? 8 * static_cast<uint64_t>(n - 1) : 0;
        sparse.sent += size_exchange;
        sparse.received += size_exchange;
      }
      const auto dense = comm::ring_allreduce_bytes(4 * dense_numel, n);
      EXPECT_EQ(b.wire_sent, sparse.sent + dense.sent);
      EXPECT_EQ(b.wire_received, sparse.received + dense.received);
      EXPECT_EQ(b.dense_wire_sent, n > 1 ? 2 * (n - 1) * 4 * total_numel / n : 0);
      sum += b;
    }
    EXPECT_EQ(exchange.total().message, sum.message);
    EXPECT_EQ(exchange.total().wire_sent, sum.wire_sent);
    EXPECT_EQ(exchange.total().dense_gradient, 2 * 4 * total_numel);
  });
}

// A 16-bit dense path: every rank receives the rank-order sum of the ranks' 16-bit values / N,
// and its message counts 2 bytes per dense-path element; the parts add up to the message.
TEST(Exchange, SixteenBitDensePathIsTheRankOrderSumAndTwoBytesAnElement) {
  constexpr int n = 3;
  const auto layout = model_layout();
  const uint64_t dense_numel = 16 + 10 + 16;
  for (const ValueType type : {ValueType::kFloat16, ValueType::kBFloat16}) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      ExchangeOptions options = exchange_options();
      options.dense_value_type = type;
      Exchange exchange(comm, layout, options);
      std::vector<std::vector<float>> updates = {std::vector<float>(1152),
                                                 std::vector<float>(3000)};
      auto in = rank_inputs(layout, comm.rank(), 0);
      for (float& x : in.dense) x = round_to(x, type);
      ASSERT_EQ(exchange.run(0, in.selections, test::spans(updates), in.dense), 0);
      for (uint64_t e = 0; e < dense_numel; ++e) {
        float sum = 0.0f;
        for (int r = 0; r < n; ++r) sum += round_to(rank_inputs(layout, r, 0).dense[e], type);
        EXPECT_EQ(in.dense[e], sum / n) << to_string(type) << " element " << e;
      }
      const auto& b = exchange.last();
      const uint64_t size = encoded_sizes(layout, n, 0, ValueType::kFloat32)[comm.rank()];
      EXPECT_EQ(b.message, size + 2 * dense_numel);
      EXPECT_EQ(b.message_dense_path, 2 * dense_numel);
      EXPECT_EQ(b.message_headers, kMessageHeaderBytes);
      EXPECT_EQ(b.message_compressed, size - kMessageHeaderBytes);
    });
  }
}

// The flag travels in the header of every message, with and without dense-path tensors: every
// rank gets the same count, and the next iteration is exact again.
// World sizes 1..8 run in UpdatesAre...; the other tests take a subset to keep the suite short.
bool secondary(const Case& c) {
  return c.world_size == 5 || c.world_size == 6 || c.world_size == 7;
}

TEST_P(ExchangeTest, ABadGradientOnOneRankIsCountedOnEveryRank) {
  const Case c = GetParam();
  if (secondary(c)) GTEST_SKIP() << "world sizes 1-4 and 8 are enough here";
  const int n = c.world_size;
  for (const auto& layout : {model_layout(), compressed_only_layout()}) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      Exchange exchange(comm, layout, options_for(c));
      std::vector<std::vector<float>> updates = {std::vector<float>(1152),
                                                 std::vector<float>(3000)};
      for (uint64_t it = 0; it < 4; ++it) {
        if (it == 1 || it == 2) {
          auto in = rank_inputs(layout, comm.rank(), it);
          // Iteration 1: the last rank flags; iteration 2: every rank flags.
          const bool ok = !(it == 1 && comm.rank() == n - 1) && it != 2;
          if (!ok) {
            for (auto& s : in.selections) s.clear();
          }
          std::vector<Selection> unapplied(in.selections.size());
          EXPECT_EQ(exchange.run(it, in.selections, test::spans(updates), in.dense, ok, unapplied),
                    it == 1 ? 1 : n)
              << "iteration " << it;
        } else {
          run_checked(comm, exchange, layout, it, Pattern::kColliding, updates, c.value_type);
        }
      }
    });
  }
}

// Iterations with different selections into the same buffers: exactly the reference at the
// applied positions and exactly 0 everywhere else, also when the buffers change between calls
// (full zeroing) or the caller wrote into them after forget_updates().
TEST_P(ExchangeTest, ReusedBuffersHoldOnlyThisIterationsSum) {
  const Case c = GetParam();
  if (secondary(c)) GTEST_SKIP() << "world sizes 1-4 and 8 are enough here";
  // Recording the positions written (the default) or not (every run zeroes in full).
  for (const bool record : {true, false}) {
    for (const auto& layout : {model_layout(), compressed_only_layout()}) {
      comm::run_local(c.world_size, quick(), [&](comm::Communicator& comm) {
        ExchangeOptions options = options_for(c);
        options.record_written = record;
        Exchange exchange(comm, layout, options);
        std::vector<std::vector<float>> first = {std::vector<float>(1152, 99.0f),
                                                 std::vector<float>(3000, 99.0f)};
        std::vector<std::vector<float>> second = first;
        for (uint64_t it = 0; it < 6; ++it) {
          // Iterations 0-1 and 4-5 use `first`, 2-3 use `second` (a change of buffers).
          auto& updates = it == 2 || it == 3 ? second : first;
          if (it == 5) {
            for (auto& u : updates) std::fill(u.begin(), u.end(), -7.0f);
            exchange.forget_updates();
          }
          run_checked(comm, exchange, layout, it, Pattern::kColliding, updates, c.value_type);
          if (record || c.algorithm == ExchangeAlgorithm::kSparseAllreduce) {
            EXPECT_FALSE(exchange.last_written(0).empty()) << "0 and numel - 1 on every rank";
          } else {
            EXPECT_THROW(exchange.last_written(0), InvalidArgument) << "nothing was recorded";
          }
        }
      });
    }
  }
}

// DGC's conservation with a real compressor (momentum 0, so v accumulates the gradient): per
// rank, over several iterations, sum of gradients = sum of what was applied from this rank +
// the velocity left, where applied = selected - returned; and the sum over ranks of what each
// applied, / N, is the update.
TEST_P(ExchangeTest, SelectedEqualsAppliedPlusReturnedPerRank) {
  const Case c = GetParam();
  if (c.value_type != ValueType::kFloat32) GTEST_SKIP() << "exact sums need fp32";
  if (secondary(c)) GTEST_SKIP() << "world sizes 1-4 and 8 are enough here";
  const int n = c.world_size;
  PolicyOptions policy;
  policy.min_numel = 1;
  const auto layout = make_layout({{"w", {40, 50}}}, policy);
  const size_t numel = 2000;
  std::mutex mutex;
  std::vector<std::vector<double>> applied_by(n, std::vector<double>(numel, 0.0));
  std::vector<std::vector<double>> update_sum(n, std::vector<double>(numel, 0.0));
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    const int r = comm.rank();
    Exchange exchange(comm, layout, options_for(c));
    CompressionOptions compression;
    compression.momentum.factor = 0.0;
    compression.seed = 17 + static_cast<uint64_t>(r);
    Compressor compressor({static_cast<int64_t>(numel)}, compression);
    std::vector<double> gradient_sum(numel, 0.0), applied(numel, 0.0), updates_seen(numel, 0.0);
    std::vector<std::vector<float>> updates = {std::vector<float>(numel)};
    std::vector<Selection> selections(1), unapplied(1);
    std::vector<float> no_dense;
    std::mt19937_64 rng(1234 + static_cast<uint64_t>(r));
    std::normal_distribution<float> normal;
    for (uint64_t it = 0; it < 12; ++it) {
      std::vector<float> g(numel);
      for (size_t i = 0; i < numel; ++i) {
        // Ranks share a common direction at low indices, so that selections collide.
        g[i] = normal(rng) + (i < 100 ? 3.0f : 0.0f);
        gradient_sum[i] += g[i];
      }
      compressor.step(0, g, /*density=*/0.02, selections[0]);
      ASSERT_EQ(exchange.run(it, selections, test::spans(updates), no_dense, true, unapplied), 0);
      compressor.return_to_velocity(0, unapplied[0]);
      for (size_t j = 0; j < selections[0].indices.size(); ++j) {
        applied[selections[0].indices[j]] += selections[0].values[j];
      }
      for (size_t j = 0; j < unapplied[0].indices.size(); ++j) {
        applied[unapplied[0].indices[j]] -= unapplied[0].values[j];
      }
      for (size_t i = 0; i < numel; ++i) updates_seen[i] += updates[0][i];
    }
    const auto v = compressor.velocity(0);
    double worst = 0.0;
    for (size_t i = 0; i < numel; ++i) {
      worst = std::max(worst, std::fabs(gradient_sum[i] - applied[i] - v[i]) /
                                  (1.0 + std::fabs(gradient_sum[i])));
    }
    EXPECT_LT(worst, 1e-5) << "rank " << r << ": gradient != applied + residual";
    std::lock_guard lock(mutex);
    applied_by[r] = applied;
    update_sum[r] = updates_seen;
  });
  double worst = 0.0;
  for (size_t i = 0; i < numel; ++i) {
    double total = 0.0;
    for (int r = 0; r < n; ++r) total += applied_by[r][i];
    for (int r = 0; r < n; ++r) {
      worst = std::max(worst, std::fabs(update_sum[r][i] - total / n) / (1.0 + std::fabs(total)));
    }
  }
  EXPECT_LT(worst, 1e-5) << "the update is not the average of what the ranks applied";
}

TEST_P(ExchangeTest, StalledRankEndsInACommErrorWithinTheTimeout) {
  const Case c = GetParam();
  if (c.world_size < 3 || c.value_type != ValueType::kFloat32) GTEST_SKIP() << "one case is enough";
  const int n = c.world_size;
  const auto layout = model_layout();
  std::vector<int> failed(n, 0);
  std::atomic<int> done{0};
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    auto options = options_for(c);
    options.timeout = milliseconds(1000);
    Exchange exchange(comm, layout, options);
    if (comm.rank() == 1) {  // stops participating
      for (int i = 0; i < 1000 && done.load() < n - 1; ++i) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      return;
    }
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    auto in = rank_inputs(layout, comm.rank(), 0);
    std::vector<Selection> unapplied(in.selections.size());
    const auto start = std::chrono::steady_clock::now();
    try {
      exchange.run(0, in.selections, test::spans(updates), in.dense, true, unapplied);
    } catch (const CommError&) {
      failed[comm.rank()] = 1;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000 + 3000));
    done.fetch_add(1);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(failed[r], r == 1 ? 0 : 1) << "rank " << r;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const ExchangeAlgorithm a : {ExchangeAlgorithm::kAllgather, ExchangeAlgorithm::kDirect,
                                    ExchangeAlgorithm::kSparseAllreduce}) {
    for (int n = 1; n <= 8; ++n) out.push_back({n, ValueType::kFloat32, a});
    out.push_back({3, ValueType::kFloat16, a});
    out.push_back({4, ValueType::kBFloat16, a});
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& param_info) {
  const char* names[] = {"fp32", "fp16", "bf16"};
  std::string algorithm = to_string(param_info.param.algorithm);
  std::replace(algorithm.begin(), algorithm.end(), '-', '_');
  return algorithm + "_n" + std::to_string(param_info.param.world_size) + "_" +
         names[static_cast<int>(param_info.param.value_type)];
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ExchangeTest, ::testing::ValuesIn(cases()), case_name);

// ---- the sparse allreduce: its pieces, its volume, its re-balancing ----

TEST(SparseAllreduce, EqualBoundsSplitTheIndexSpace) {
  EXPECT_EQ(sparse::equal_bounds(10, 3), (std::vector<uint64_t>{0, 3, 6, 10}));
  EXPECT_EQ(sparse::equal_bounds(2, 4), (std::vector<uint64_t>{0, 0, 1, 1, 2}));
  EXPECT_EQ(sparse::equal_bounds(7, 1), (std::vector<uint64_t>{0, 7}));
}

TEST(SparseAllreduce, BalancedBoundsPutTheSameNumberOfIndicesInEachRegion) {
  std::vector<uint64_t> indices;
  for (uint64_t i = 0; i < 90; ++i) indices.push_back(i);               // 90 near the start
  for (uint64_t i = 0; i < 10; ++i) indices.push_back(1000 + i * 900);  // 10 spread out
  const auto bounds = sparse::balanced_bounds(indices, 10000, 4);
  ASSERT_EQ(bounds.size(), 5u);
  EXPECT_EQ(bounds.front(), 0u);
  EXPECT_EQ(bounds.back(), 10000u);
  for (int p = 0; p < 4; ++p) {
    const auto in_region = std::count_if(indices.begin(), indices.end(), [&](uint64_t i) {
      return i >= bounds[p] && i < bounds[p + 1];
    });
    EXPECT_EQ(in_region, 25) << "region " << p;
  }
  EXPECT_EQ(sparse::balanced_bounds({}, 10, 3), sparse::equal_bounds(10, 3));
}

TEST(SparseAllreduce, ReduceSumsCollidingIndicesAndKeepLargestKeepsTheTop) {
  const std::vector<std::vector<sparse::Entry>> streams = {
      {{1, 1.0f}, {5, 2.0f}}, {}, {{1, -3.0f}, {2, 0.5f}, {9, 4.0f}}};
  std::vector<sparse::Entry> out;
  EXPECT_EQ(sparse::reduce_sorted(streams, out), 5u);
  EXPECT_EQ(out, (std::vector<sparse::Entry>{{1, -2.0f}, {2, 0.5f}, {5, 2.0f}, {9, 4.0f}}));
  EXPECT_EQ(sparse::quota(5, 3), 2u);
  EXPECT_EQ(sparse::quota(0, 3), 0u);
  auto kept = out;
  sparse::keep_largest(kept, 3);  // |-2| ties |2|: both kept; 0.5 dropped
  EXPECT_EQ(kept, (std::vector<sparse::Entry>{{1, -2.0f}, {5, 2.0f}, {9, 4.0f}}));
  kept = out;
  sparse::keep_largest(kept, 2);  // the tie at 2 goes to the lower index
  EXPECT_EQ(kept, (std::vector<sparse::Entry>{{1, -2.0f}, {9, 4.0f}}));
  kept = out;
  sparse::keep_largest(kept, 10);
  EXPECT_EQ(kept, out);
}

// Receive volume at N = 8 on one large tensor with uniform selections (bytes, deterministic):
// sparse-allreduce receives at most 1/3 of what allgather receives, and the re-balanced regions
// follow a skewed distribution.
TEST(SparseAllreduce, ReceivesUnderAThirdOfAllgathersBytesAtEightRanks) {
  constexpr int n = 8;
  PolicyOptions policy;
  policy.min_numel = 1;
  const auto layout = make_layout({{"w", {1000, 1000}}}, policy);
  std::map<ExchangeAlgorithm, uint64_t> received;
  std::mutex mutex;
  for (const ExchangeAlgorithm a :
       {ExchangeAlgorithm::kAllgather, ExchangeAlgorithm::kSparseAllreduce}) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      ExchangeOptions options = exchange_options();
      options.algorithm = a;
      Exchange exchange(comm, layout, options);
      std::vector<std::vector<float>> updates = {std::vector<float>(1000000)};
      std::vector<Selection> selections = {test::pattern_selection(
          Pattern::kUniform, 1000000, 1000, comm.rank(), 0, 99 + comm.rank())};
      std::vector<Selection> unapplied(1);
      std::vector<float> no_dense;
      uint64_t most = 0;
      for (uint64_t it = 0; it < 3; ++it) {
        ASSERT_EQ(exchange.run(it, selections, test::spans(updates), no_dense, true, unapplied), 0);
        most = std::max(most, exchange.last().wire_received);
      }
      std::lock_guard lock(mutex);
      received[a] = std::max(received[a], most);
    });
  }
  std::printf(
      "received per rank and iteration at N = 8: allgather %llu B, sparse-allreduce %llu B\n",
      static_cast<unsigned long long>(received[ExchangeAlgorithm::kAllgather]),
      static_cast<unsigned long long>(received[ExchangeAlgorithm::kSparseAllreduce]));
  EXPECT_LE(3 * received[ExchangeAlgorithm::kSparseAllreduce],
            received[ExchangeAlgorithm::kAllgather]);
}

TEST(SparseAllreduce, RegionsFollowWhereTheSelectionsFall) {
  constexpr int n = 4;
  PolicyOptions policy;
  policy.min_numel = 1;
  const auto layout = make_layout({{"w", {100, 100}}}, policy);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    ExchangeOptions options = exchange_options();
    options.algorithm = ExchangeAlgorithm::kSparseAllreduce;
    options.rebalance_interval = 1;
    Exchange exchange(comm, layout, options);
    EXPECT_EQ(exchange.region_bounds(), sparse::equal_bounds(10000, n));
    std::vector<std::vector<float>> updates = {std::vector<float>(10000)};
    std::vector<Selection> unapplied(1);
    std::vector<float> no_dense;
    for (uint64_t it = 0; it < 3; ++it) {
      // Everything in the first 10% of the tensor.
      std::vector<Selection> selections = {test::pattern_selection(
          Pattern::kUniform, 1000, 60, comm.rank(), it, 7 + comm.rank() + 100 * it)};
      ASSERT_EQ(exchange.run(it, selections, test::spans(updates), no_dense, true, unapplied), 0);
    }
    const auto& bounds = exchange.region_bounds();
    EXPECT_LE(bounds[n - 1], 1000u) << "every region boundary moved into the selected part";
    EXPECT_EQ(bounds[n], 10000u);
  });
}

TEST(Auto, RuleByWorldSizeDensityAndMessageSize) {
  EXPECT_EQ(choose_algorithm(1, 0.001, 25'557'032), ExchangeAlgorithm::kAllgather);
  EXPECT_EQ(choose_algorithm(4, 0.001, 25'557'032), ExchangeAlgorithm::kDirect);
  EXPECT_EQ(choose_algorithm(8, 0.001, 25'557'032), ExchangeAlgorithm::kSparseAllreduce);
  EXPECT_EQ(choose_algorithm(64, 0.001, 25'557'032), ExchangeAlgorithm::kSparseAllreduce);
  // Small messages are latency-bound: one round beats four, however many ranks.
  EXPECT_EQ(choose_algorithm(64, 0.001, 100'000), ExchangeAlgorithm::kDirect);
  // A higher density makes the same model's messages large enough.
  EXPECT_EQ(choose_algorithm(8, 0.001, 1'000'000), ExchangeAlgorithm::kDirect);
  EXPECT_EQ(choose_algorithm(8, 0.1, 1'000'000), ExchangeAlgorithm::kSparseAllreduce);
  EXPECT_THROW(choose_algorithm(0, 0.001, 10), InvalidArgument);
  EXPECT_EQ(parse_exchange_algorithm("sparse-allreduce"), ExchangeAlgorithm::kSparseAllreduce);
  EXPECT_THROW(parse_exchange_algorithm("ring"), InvalidArgument);
  comm::run_local(2, quick(), [](comm::Communicator& comm) {
    ExchangeOptions options = exchange_options();
    options.algorithm = ExchangeAlgorithm::kAuto;
    Exchange exchange(comm, model_layout(), options);
    EXPECT_EQ(exchange.algorithm(), ExchangeAlgorithm::kDirect);
  });
}

TEST(Exchange, SparseAllreduceRequiresTheUnappliedOutput) {
  comm::run_local(1, quick(), [](comm::Communicator& comm) {
    ExchangeOptions options = exchange_options();
    options.algorithm = ExchangeAlgorithm::kSparseAllreduce;
    const auto layout = model_layout();
    Exchange exchange(comm, layout, options);
    auto in = rank_inputs(layout, 0, 0);
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    EXPECT_THROW(exchange.run(0, in.selections, test::spans(updates), in.dense), InvalidArgument);
  });
  // Without compressed tensors (e.g. the dense baseline) there is nothing to hand back.
  comm::run_local(2, quick(), [](comm::Communicator& comm) {
    ExchangeOptions options = exchange_options();
    options.algorithm = ExchangeAlgorithm::kSparseAllreduce;
    PolicyOptions policy;
    policy.min_numel = 1 << 20;
    const auto layout = make_layout({{"w", {4, 3}}, {"b", {4}}}, policy);
    Exchange exchange(comm, layout, options);
    ASSERT_TRUE(exchange.compressed_tensors().empty());
    std::vector<float> dense(16, static_cast<float>(comm.rank()));
    ASSERT_EQ(exchange.run(0, {}, {}, dense), 0);
    for (float x : dense) EXPECT_EQ(x, 0.5f);
  });
}

TEST(Exchange, RejectsArgumentsThatDoNotMatchTheLayout) {
  const auto layout = model_layout();
  comm::run_local(1, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options());
    auto in = rank_inputs(layout, 0, 0);
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    std::vector<std::vector<float>> short_updates = {std::vector<float>(1152),
                                                     std::vector<float>(2999)};
    EXPECT_THROW(exchange.run(0, std::span(in.selections).first(1), test::spans(updates), in.dense),
                 InvalidArgument);
    EXPECT_THROW(exchange.run(0, in.selections, test::spans(short_updates), in.dense),
                 InvalidArgument);
    in.dense.pop_back();
    EXPECT_THROW(exchange.run(0, in.selections, test::spans(updates), in.dense), InvalidArgument);
  });
}

// ---- handshake ----

// Runs the handshake on 4 ranks where `vary(rank, layout, settings)` may change one rank's view;
// returns each rank's MismatchError message ("" if none).
std::vector<std::string> handshake_errors(
    const std::function<void(int, std::vector<TensorSpec>&, std::string&)>& vary) {
  constexpr int n = 4;
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    auto layout = model_layout();
    std::string settings = "density=0.001\nmomentum=0.9\nnesterov=false\n";
    vary(comm.rank(), layout, settings);
    try {
      handshake(comm, layout, settings, milliseconds(10000));
    } catch (const MismatchError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  return errors;
}

void expect_same_error_everywhere(const std::vector<std::string>& errors,
                                  const std::vector<std::string>& parts) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_EQ(errors[r], errors[0]) << "rank " << r << " reports a different message";
  }
  for (const auto& part : parts) {
    EXPECT_NE(errors[0].find(part), std::string::npos) << "missing '" << part << "' in\n"
                                                       << errors[0];
  }
}

TEST(Handshake, AgreementPasses) {
  const auto errors = handshake_errors([](int, auto&, auto&) {});
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Handshake, ShapeMismatchNamesTensorRanksAndBothShapes) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 2) layout = model_layout(299);
  });
  expect_same_error_everywhere(
      errors, {"tensor 2 ('fc.weight')", "rank 0 has 'fc.weight' shape [10, 300] path compressed",
               "rank 2 has 'fc.weight' shape [10, 299] path compressed"});
}

TEST(Handshake, SettingMismatchNamesTheKeyRanksAndBothValues) {
  const auto errors = handshake_errors([](int rank, auto&, auto& settings) {
    if (rank == 1 || rank == 3) settings = "density=0.01\nmomentum=0.9\nnesterov=false\n";
  });
  expect_same_error_everywhere(
      errors, {"setting 'density'", "rank 0 has '0.001'", "ranks 1, 3 have '0.01'"});
}

TEST(Handshake, MissingSettingIsNamed) {
  const auto errors = handshake_errors([](int rank, auto&, auto& settings) {
    if (rank == 3) settings = "density=0.001\nmomentum=0.9\n";
  });
  expect_same_error_everywhere(
      errors, {"setting 'nesterov'", "rank 0 has 'false'", "rank 3 has (not set)"});
}

// A rank whose step travels in one message has no bucket keys; the setting that decided it is
// the one named, though 'bucket...' sorts before it.
TEST(Handshake, BucketKeysAreNamedAfterTheSettingsThatDecideThem) {
  const auto errors = handshake_errors([](int rank, auto&, auto& settings) {
    settings +=
        rank == 1 ? "on_nonfinite=skip\n" : "on_nonfinite=stop\nbucket_cap_mb=25\nbucket=0\n";
  });
  expect_same_error_everywhere(
      errors, {"setting 'on_nonfinite'", "rank 0 has 'stop'", "rank 1 has 'skip'"});
  const auto caps = handshake_errors([](int rank, auto&, auto& settings) {
    settings += rank == 1 ? "bucket_cap_mb=5\nbucket=0\n" : "bucket_cap_mb=25\nbucket=0\n";
  });
  expect_same_error_everywhere(caps, {"setting 'bucket_cap_mb'", "rank 1 has '5'"});
}

TEST(Handshake, OrderMismatchIsNamed) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 1) std::swap(layout[1], layout[3]);
  });
  expect_same_error_everywhere(errors, {"tensor 1 ('conv.bias')", "rank 1 has 'fc.bias'"});
}

TEST(Handshake, PathMismatchIsNamed) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 2) layout[0].path = TensorPath::kDense;
  });
  expect_same_error_everywhere(errors, {"tensor 0 ('conv.weight')", "path compressed",
                                        "rank 2 has 'conv.weight' shape [16, 8, 3, 3] path dense"});
}

TEST(Handshake, ExtraTensorIsNamed) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 0) layout.push_back(TensorSpec{"extra", {3}, TensorPath::kDense});
  });
  expect_same_error_everywhere(errors,
                               {"the number of tensors", "rank 0 has 6", "ranks 1, 2, 3 have 5"});
}

TEST(Handshake, ValueTypeIsPartOfTheAgreement) {
  constexpr int n = 2;
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    try {
      Exchange exchange(
          comm, model_layout(),
          exchange_options(comm.rank() == 0 ? ValueType::kFloat32 : ValueType::kFloat16));
    } catch (const MismatchError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  expect_same_error_everywhere(errors, {"setting 'exchange.value_type'", "'fp32'", "'fp16'"});
}

TEST(Handshake, AlgorithmIsPartOfTheAgreement) {
  constexpr int n = 4;
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    ExchangeOptions options = exchange_options();
    options.algorithm =
        comm.rank() == 2 ? ExchangeAlgorithm::kSparseAllreduce : ExchangeAlgorithm::kDirect;
    try {
      Exchange exchange(comm, model_layout(), options);
    } catch (const MismatchError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  expect_same_error_everywhere(errors,
                               {"setting 'exchange.algorithm'", "rank 0 has 'direct (direct)'",
                                "rank 2 has 'sparse-allreduce (sparse-allreduce)'"});
}

// ---- a corrupt or out-of-step message ----

// Forwards to a real communicator; when armed, flips one payload byte of rank `victim`'s
// message in what allgatherv or alltoallv returns, as a faulty link or peer would.
class CorruptingCommunicator final : public comm::ForwardingCommunicator {
 public:
  CorruptingCommunicator(comm::Communicator& inner, int victim)
      : ForwardingCommunicator(inner), victim_(victim) {}
  bool armed = false;
  bool flip_last = false;  // flip the last byte instead of a payload byte

 protected:
  void on_delivered(const char*, std::vector<std::vector<uint8_t>>& all) override {
    if (armed && all[victim_].size() > kMessageHeaderBytes + 8) {
      if (flip_last) {
        all[victim_].back() ^= 0x5A;
      } else {
        all[victim_][kMessageHeaderBytes + 8] ^= 0x5A;
      }
    }
  }

 private:
  int victim_;
};

// allgather and direct: every rank receives rank 2's corrupt message and names it. With
// sparse-allreduce only the owners that received a corrupt part from rank 2 can see it: they
// name it, and the others fail with a CommError when those stop (nobody applies anything), at
// the timeout: 2 s here instead of the suite's 10, which every sanitizer build would wait out.
TEST(Exchange, CorruptMessageIsADecodeErrorNamingTheSender) {
  constexpr int n = 3;
  const auto layout = model_layout();
  for (const ExchangeAlgorithm a : {ExchangeAlgorithm::kAllgather, ExchangeAlgorithm::kDirect,
                                    ExchangeAlgorithm::kSparseAllreduce}) {
    std::vector<std::string> errors(n);
    comm::GlooOptions gloo = quick();
    gloo.timeout = milliseconds(2000);
    comm::run_local(n, gloo, [&](comm::Communicator& real) {
      CorruptingCommunicator comm(real, 2);
      ExchangeOptions options = exchange_options();
      options.algorithm = a;
      options.timeout = milliseconds(2000);
      Exchange exchange(comm, layout, options);
      std::vector<std::vector<float>> updates = {std::vector<float>(1152),
                                                 std::vector<float>(3000)};
      auto in = rank_inputs(layout, comm.rank(), 0);
      comm.armed = true;
      std::vector<Selection> unapplied(in.selections.size());
      try {
        exchange.run(0, in.selections, test::spans(updates), in.dense, true, unapplied);
        errors[comm.rank()] = "no error";
      } catch (const DecodeError& e) {
        errors[comm.rank()] = e.what();
      } catch (const CommError& e) {
        errors[comm.rank()] = std::string("CommError: ") + e.what();
      }
    });
    int named = 0;
    for (int r = 0; r < n; ++r) {
      const bool names = errors[r].find("message from rank 2 of 3") != std::string::npos;
      named += names;
      if (a != ExchangeAlgorithm::kSparseAllreduce) {
        EXPECT_TRUE(names) << to_string(a) << ": " << errors[r];
      } else {
        EXPECT_TRUE(names || errors[r].rfind("CommError", 0) == 0) << errors[r];
      }
    }
    EXPECT_GE(named, 1) << to_string(a);
  }
}

// Without dense-path tensors: a corrupt message (header, payload, or its last byte) is named by
// its sender, and nothing is written into the updates.
TEST(Exchange, CorruptMessageWithoutDenseTensorsWritesNothing) {
  constexpr int n = 3;
  const auto layout = compressed_only_layout();
  for (const bool flip_last : {false, true}) {
    std::vector<std::string> errors(n);
    comm::run_local(n, quick(), [&](comm::Communicator& real) {
      CorruptingCommunicator comm(real, 2);
      comm.flip_last = flip_last;
      Exchange exchange(comm, layout, exchange_options());
      std::vector<std::vector<float>> updates = {std::vector<float>(1152),
                                                 std::vector<float>(3000)};
      auto in = rank_inputs(layout, comm.rank(), 0);
      ASSERT_EQ(exchange.run(0, in.selections, test::spans(updates), in.dense), 0);
      const auto before = updates;
      comm.armed = true;
      in = rank_inputs(layout, comm.rank(), 1);
      try {
        exchange.run(1, in.selections, test::spans(updates), in.dense);
      } catch (const DecodeError& e) {
        errors[comm.rank()] = e.what();
      }
      EXPECT_EQ(updates, before) << "rank " << comm.rank();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_NE(errors[r].find("message from rank 2 of 3"), std::string::npos) << errors[r];
      EXPECT_NE(errors[r].find("checksum"), std::string::npos) << errors[r];
    }
  }
}

// A well-formed message from an owner with sums outside its region (a peer that disagrees on
// the bounds) is an error on every rank before anything is written.
class ForgingCommunicator final : public comm::ForwardingCommunicator {
 public:
  explicit ForgingCommunicator(comm::Communicator& inner) : ForwardingCommunicator(inner) {}
  RunId run_id{};  // the job's, so that only the region check can refuse the forged sums

 protected:
  void on_delivered(const char* collective, std::vector<std::vector<uint8_t>>& all) override {
    if (std::string_view(collective) != "alltoallv") return;
    if (++calls_ % 2 == 0) {  // the second phase: rank 2's kept sums claim index 0 (region 0)
      MessageWriter writer(ValueType::kFloat32, 0, run_id);
      writer.add(0, 1152, std::vector<uint32_t>{0}, std::vector<float>{1.0f});
      writer.finish(all[2]);
    }
  }

 private:
  int calls_ = 0;
};

TEST(Exchange, SparseAllreduceRejectsSumsOutsideTheOwnersRegion) {
  constexpr int n = 3;
  const auto layout = model_layout();
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& real) {
    ForgingCommunicator comm(real);
    ExchangeOptions options = exchange_options();
    options.algorithm = ExchangeAlgorithm::kSparseAllreduce;
    Exchange exchange(comm, layout, options);
    comm.run_id = exchange.run_id();
    std::vector<std::vector<float>> updates = {std::vector<float>(1152, 5.0f),
                                               std::vector<float>(3000, 5.0f)};
    const auto before = updates;
    auto in = rank_inputs(layout, comm.rank(), 0);
    std::vector<Selection> unapplied(in.selections.size());
    try {
      exchange.run(0, in.selections, test::spans(updates), in.dense, true, unapplied);
    } catch (const DecodeError& e) {
      errors[comm.rank()] = e.what();
    }
    EXPECT_EQ(updates, before) << "nothing written on rank " << comm.rank();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("reduced region message from rank 2"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("outside its region"), std::string::npos) << errors[r];
  }
}

// A message of another iteration is refused by the codec (kWrongIteration) before anything is
// written, on every algorithm.
TEST(Exchange, RanksOutOfStepAreAnError) {
  constexpr int n = 2;
  const auto layout = model_layout();
  for (const ExchangeAlgorithm a : {ExchangeAlgorithm::kAllgather, ExchangeAlgorithm::kDirect,
                                    ExchangeAlgorithm::kSparseAllreduce}) {
    std::vector<std::string> errors(n);
    std::vector<DecodeError::Reason> reasons(n, DecodeError::Reason::kMalformed);
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      ExchangeOptions options = exchange_options();
      options.algorithm = a;
      Exchange exchange(comm, layout, options);
      std::vector<std::vector<float>> updates = {std::vector<float>(1152, 5.0f),
                                                 std::vector<float>(3000, 5.0f)};
      const auto before = updates;
      const uint64_t it = comm.rank() == 1 ? 8 : 7;
      auto in = rank_inputs(layout, comm.rank(), it);
      std::vector<Selection> unapplied(in.selections.size());
      try {
        exchange.run(it, in.selections, test::spans(updates), in.dense, true, unapplied);
      } catch (const DecodeError& e) {
        errors[comm.rank()] = e.what();
        reasons[comm.rank()] = e.reason();
      }
      EXPECT_EQ(updates, before) << "nothing written on rank " << comm.rank();
    });
    EXPECT_NE(errors[0].find("from rank 1 of 2 (iteration 7): invalid DGC message: for "
                             "iteration 8 but this rank is at iteration 7"),
              std::string::npos)
        << to_string(a) << ": " << errors[0];
    EXPECT_NE(errors[1].find("from rank 0 of 2 (iteration 8): invalid DGC message: for "
                             "iteration 7 but this rank is at iteration 8"),
              std::string::npos)
        << to_string(a) << ": " << errors[1];
    EXPECT_EQ(reasons[0], DecodeError::Reason::kWrongIteration);
    EXPECT_EQ(reasons[1], DecodeError::Reason::kWrongIteration);
  }
}

// ---- broadcast_parameters ----

TEST(BroadcastParameters, EveryRankEndsWithRankZerosValues) {
  for (int n : {1, 2, 3, 5}) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      std::vector<float> a(1000), b(7), empty;
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(comm.rank() * 10000 + i);
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(-comm.rank() - 1);
      std::vector<std::span<float>> params = {a, empty, b};
      broadcast_parameters(comm, params);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], static_cast<float>(i));
      for (float v : b) ASSERT_EQ(v, -1.0f);
    });
  }
}

TEST(BroadcastParameters, DifferentModelSizesAreAMismatch) {
  std::vector<int> mismatches(2, 0);
  comm::run_local(2, quick(), [&](comm::Communicator& comm) {
    std::vector<float> a(comm.rank() == 0 ? 10 : 11);
    std::vector<std::span<float>> params = {a};
    try {
      broadcast_parameters(comm, params);
    } catch (const MismatchError&) {
      mismatches[comm.rank()] = 1;
    }
  });
  EXPECT_EQ(mismatches, (std::vector<int>{1, 1}));
}

}  // namespace
}  // namespace dgc
