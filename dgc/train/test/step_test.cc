// DistributedStep::run_and_apply (the directions applied to the weights in the same pass) against
// run() followed by `w[e] -= lr * direction[e]`, bit for bit: weights and every state buffer, on
// 1 and 2 ranks, dense and DGC, each dense-path strategy, plain and Nesterov, with and without
// weight decay, through the density and learning-rate warm-ups, and a step skipped for a
// non-finite gradient in a compressed tensor. The dense path's copy with its finiteness check.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/comm/launch.h"
#include "dgc/train/step.h"
#include "dgc/train/step_kernels.h"

namespace dgc::train {
namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

const Shapes& shapes() {
  static const Shapes s = {{"conv.weight", {12, 3, 5, 5}},
                           {"conv.bias", {12}},
                           {"fc.weight", {10, 120}},
                           {"fc.bias", {10}}};
  return s;
}

size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (const int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// Rank- and step-distinct values with exact zeros among them; weights start with some -0.
float gradient_value(int rank, int step, size_t tensor, size_t e) {
  if ((e + static_cast<size_t>(step)) % 11 == 0) return 0.0f;
  return static_cast<float>(std::sin(0.7 * static_cast<double>(e) + 1.9 * rank + 0.31 * step +
                                     static_cast<double>(tensor)) *
                            (1.0 + 0.05 * static_cast<double>(e % 7)));
}

std::vector<std::vector<float>> initial_weights() {
  std::vector<std::vector<float>> w;
  for (size_t t = 0; t < shapes().size(); ++t) {
    w.emplace_back(numel(shapes()[t].second));
    for (size_t e = 0; e < w.back().size(); ++e) {
      w.back()[e] = e % 9 == 0 ? -0.0f : 0.02f * static_cast<float>(static_cast<int>(e % 13) - 6);
    }
  }
  return w;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  std::string name;
  Compression compression;
  DensePath dense_path;
  bool nesterov;
  double weight_decay;
  int world;
};

class RunAndApply : public ::testing::TestWithParam<Case> {};

TEST_P(RunAndApply, EqualsRunThenTheUpdateBitForBit) {
  const Case c = GetParam();
  constexpr int kSteps = 7;
  constexpr int kBadStep = 5;  // rank world-1: NaN in a compressed tensor's gradient
  OptimizerOptions options;
  options.compression = c.compression;
  options.dense_path = c.dense_path;
  options.policy.min_numel = 100;  // the weights compressed, the biases dense
  options.compressor.momentum.nesterov = c.nesterov;
  options.weight_decay = c.weight_decay;
  options.density = {.after_warmup = 0.01, .warmup_epochs = 1.0, .iterations_per_stage = 0};
  options.iterations_per_epoch = 3;
  options.lr = {.base = 0.1, .warmup_epochs = 1.0};
  options.lr.total_epochs = 4;
  options.on_nonfinite = NonFinitePolicy::kSkip;

  comm::GlooOptions gloo;
  gloo.timeout = std::chrono::seconds(30);
  comm::run_local(c.world, gloo, [&](comm::Communicator& comm) {
    DistributedStep stored(comm, shapes(), options);   // run(), then w -= lr * d
    DistributedStep applied(comm, shapes(), options);  // run_and_apply()
    auto w_stored = initial_weights();
    auto w_applied = initial_weights();
    std::vector<std::vector<float>> directions;
    for (const auto& w : w_stored) directions.emplace_back(w.size());
    for (int s = 0; s < kSteps; ++s) {
      std::vector<std::vector<float>> g1, g2;
      for (size_t t = 0; t < shapes().size(); ++t) {
        g1.emplace_back(w_stored[t].size());
        for (size_t e = 0; e < g1[t].size(); ++e) g1[t][e] = gradient_value(comm.rank(), s, t, e);
      }
      if (s == kBadStep && comm.rank() == c.world - 1) g1[2][7] = std::nanf("");
      g2 = g1;
      std::vector<std::span<float>> grads1, grads2, dirs, weights2;
      std::vector<std::span<const float>> weights1;
      for (size_t t = 0; t < shapes().size(); ++t) {
        grads1.emplace_back(g1[t]);
        grads2.emplace_back(g2[t]);
        dirs.emplace_back(directions[t]);
        weights1.emplace_back(w_stored[t]);
        weights2.emplace_back(w_applied[t]);
      }
      const double lr = stored.update_lr_at(stored.iteration());
      const bool taken1 = stored.run(grads1, weights1, dirs);
      const bool taken2 = applied.run_and_apply(grads2, weights2);
      ASSERT_EQ(taken1, taken2) << "step " << s;
      EXPECT_EQ(taken1, s != kBadStep) << "step " << s;
      if (taken1) {
        for (size_t t = 0; t < shapes().size(); ++t) {
          for (size_t e = 0; e < directions[t].size(); ++e) {
            w_stored[t][e] -= static_cast<float>(lr) * directions[t][e];
          }
        }
      }
      for (size_t t = 0; t < shapes().size(); ++t) {
        ASSERT_TRUE(same_bits(w_stored[t], w_applied[t]))
            << "rank " << comm.rank() << " step " << s << " tensor " << shapes()[t].first;
      }
      const auto state1 = stored.state_buffers();
      const auto state2 = applied.state_buffers();
      ASSERT_EQ(state1.size(), state2.size());
      for (size_t b = 0; b < state1.size(); ++b) {
        ASSERT_EQ(state1[b].name, state2[b].name);
        ASSERT_TRUE(same_bits(state1[b].values, state2[b].values))
            << "rank " << comm.rank() << " step " << s << " " << state1[b].name;
      }
    }
    EXPECT_EQ(applied.skipped_steps(), 1);
    // The weights moved (the test compares something).
    EXPECT_FALSE(same_bits(w_applied[2], initial_weights()[2]));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RunAndApply,
    ::testing::Values(
        Case{"DenseWorld1", Compression::kNone, DensePath::kExact, false, 1e-2, 1},
        Case{"DenseNesterovWorld2", Compression::kNone, DensePath::kExact, true, 1e-2, 2},
        Case{"GroupedWorld1", Compression::kDgc, DensePath::kGrouped, false, 1e-2, 1},
        Case{"GroupedNesterovWorld2", Compression::kDgc, DensePath::kGrouped, true, 1e-2, 2},
        Case{"GroupedNoDecayWorld2", Compression::kDgc, DensePath::kGrouped, false, 0.0, 2},
        Case{"ExactWorld2", Compression::kDgc, DensePath::kExact, true, 1e-2, 2},
        Case{"Float16NoDecayWorld1", Compression::kDgc, DensePath::kFloat16, false, 0.0, 1},
        Case{"BFloat16World2", Compression::kDgc, DensePath::kBFloat16, false, 1e-2, 2}),
    [](const auto& p) { return p.param.name; });

// The copy into the dense-path buffer is the dense path's finiteness check: short copies and long
// (streamed) ones, any alignment, a non-finite value anywhere.
TEST(CopyFinite, CopiesAndFindsEveryNonFiniteValue) {
  for (const size_t n : {size_t{1}, size_t{7}, size_t{70001}}) {
    std::vector<float> in(n + 3), out(n + 3);
    for (size_t e = 0; e < in.size(); ++e) in[e] = gradient_value(0, 0, 0, e);
    for (const size_t shift : {size_t{0}, size_t{1}, size_t{3}}) {
      std::fill(out.begin(), out.end(), 5.0f);
      EXPECT_TRUE(kernels::copy_finite(in.data() + shift, out.data() + 3 - shift, n));
      EXPECT_TRUE(same_bits(std::span<const float>(in.data() + shift, n),
                            std::span<const float>(out.data() + 3 - shift, n)))
          << n << " elements, shift " << shift;
      for (const size_t at : {size_t{0}, n / 2, n - 1}) {
        for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
          const float kept = in[shift + at];
          in[shift + at] = bad;
          EXPECT_FALSE(kernels::copy_finite(in.data() + shift, out.data() + 3 - shift, n))
              << n << " elements, " << bad << " at " << at << ", shift " << shift;
          in[shift + at] = kept;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dgc::train
