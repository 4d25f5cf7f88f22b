// Gradient buckets (buckets.h) against the unbucketed step: the same weights, state and RNG bit
// for bit after every step (per-tensor selection; 1, 2 and 4 ranks; several caps; through the
// density warm-up), through BucketedStep and through the libtorch optimizer's autograd hooks.
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/train/buckets.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/optimizer.h"

namespace dgc::train {
namespace {

comm::GlooOptions gloo_options() {
  comm::GlooOptions options;
  options.timeout = std::chrono::seconds(30);
  return options;
}

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// A small CNN's tensors: compressed kernels and dense 1-D parameters, interleaved.
Shapes model_shapes() {
  return {{"conv1.weight", {16, 3, 3, 3}},  {"bn1.weight", {16}},     {"bn1.bias", {16}},
          {"conv2.weight", {32, 16, 3, 3}}, {"bn2.weight", {32}},     {"bn2.bias", {32}},
          {"conv3.weight", {32, 32, 3, 3}}, {"fc.weight", {10, 288}}, {"fc.bias", {10}}};
}

// Four warm-up stages of two iterations (densities 0.25 ... 0.0039), then d = 0.001.
OptimizerOptions step_options(Compression compression, DensePath dense_path) {
  OptimizerOptions o;
  o.compression = compression;
  o.dense_path = dense_path;
  o.policy.min_numel = 256;
  o.iterations_per_epoch = 4;
  o.density = {.after_warmup = 0.001, .warmup_epochs = 2.0, .iterations_per_stage = 2};
  o.lr.base = 0.1;
  o.weight_decay = 1e-4;
  o.compressor.momentum.factor = 0.9;
  return o;
}

// Rank-distinct gradients of one step.
std::vector<std::vector<float>> gradients(const Shapes& shapes, int rank, int step) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + step));
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<std::vector<float>> grads;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    std::vector<float> g(static_cast<size_t>(n));
    for (auto& x : g) x = normal(rng);
    grads.push_back(std::move(g));
  }
  return grads;
}

// One model's weights, stepped by one step object.
struct Replica {
  std::vector<std::vector<float>> weights, directions;
  explicit Replica(const Shapes& shapes) {
    for (const auto& g : gradients(shapes, 99, 0)) {
      weights.push_back(g);
      directions.emplace_back(g.size());
    }
  }
  void step(BucketedStep& step, std::vector<std::vector<float>> grads) {
    std::vector<std::span<float>> g, d;
    std::vector<std::span<const float>> w;
    for (size_t t = 0; t < grads.size(); ++t) {
      g.emplace_back(grads[t]);
      w.emplace_back(weights[t]);
      d.emplace_back(directions[t]);
    }
    ASSERT_TRUE(step.run(g, w, d));
    const auto lr = static_cast<float>(step.update_lr_at(step.iteration() - 1));
    for (size_t t = 0; t < weights.size(); ++t) {
      for (size_t e = 0; e < weights[t].size(); ++e) weights[t][e] -= lr * directions[t][e];
    }
  }
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// world, cap MB, compression, dense path, last bucket cap MB
using Case = std::tuple<int, double, Compression, DensePath, double>;

class Buckets : public ::testing::TestWithParam<Case> {};

TEST_P(Buckets, EqualTheUnbucketedStepBitForBit) {
  const auto [world, cap_mb, compression, dense_path, last_cap_mb] = GetParam();
  constexpr int kSteps = 12;
  const Shapes shapes = model_shapes();
  // The fp32 ring allreduce sums in an order that depends on the buffer from 3 ranks on.
  const bool ring = (compression == Compression::kNone || dense_path == DensePath::kExact);
  const bool exact_bits = !(ring && world > 2);
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    OptimizerOptions options = step_options(compression, dense_path);
    BucketedStep one(comm, shapes, options);
    options.bucket_cap_mb = cap_mb;
    options.last_bucket_cap_mb = last_cap_mb;
    BucketedStep bucketed(comm, shapes, options);
    EXPECT_EQ(one.bucket_count(), 1u);
    EXPECT_GT(bucketed.bucket_count(), 1u) << "the cap should cut the model into buckets";
    EXPECT_EQ(bucketed.settings(), one.settings());
    Replica a(shapes), b(shapes);
    for (int s = 0; s < kSteps; ++s) {
      const auto grads = gradients(shapes, comm.rank(), s);
      a.step(one, grads);
      b.step(bucketed, grads);
      for (size_t t = 0; t < shapes.size(); ++t) {
        if (exact_bits) {
          ASSERT_TRUE(same_bits(a.weights[t], b.weights[t]))
              << "rank " << comm.rank() << " step " << s << " tensor " << shapes[t].first;
        } else {
          for (size_t e = 0; e < a.weights[t].size(); ++e) {
            ASSERT_NEAR(a.weights[t][e], b.weights[t][e], 1e-6);
          }
        }
      }
      if (!exact_bits) continue;
      const auto sa = one.state_buffers();
      const auto sb = bucketed.state_buffers();
      ASSERT_EQ(sa.size(), sb.size());
      for (const auto& x : sa) {
        bool found = false;
        for (const auto& y : sb) {
          if (y.name != x.name) continue;
          found = true;
          EXPECT_TRUE(same_bits(x.values, y.values)) << x.name << " at step " << s;
        }
        EXPECT_TRUE(found) << x.name;
      }
      EXPECT_EQ(one.rng_state(), bucketed.rng_state()) << "step " << s;
      EXPECT_EQ(one.total_bytes().message_compressed, bucketed.total_bytes().message_compressed);
      EXPECT_EQ(one.total_bytes().message_dense_path, bucketed.total_bytes().message_dense_path);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, Buckets,
    ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0.001, 0.02),
                       ::testing::Values(Compression::kDgc),
                       ::testing::Values(DensePath::kGrouped, DensePath::kExact),
                       ::testing::Values(0.0)));
INSTANTIATE_TEST_SUITE_P(Dense, Buckets,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0.01),
                                            ::testing::Values(Compression::kNone),
                                            ::testing::Values(DensePath::kExact),
                                            ::testing::Values(0.0)));
// The last bucket of tensors cut down to conv1 alone (--last-bucket-cap-mb).
INSTANTIATE_TEST_SUITE_P(
    LastBucket, Buckets,
    ::testing::Combine(::testing::Values(2, 4), ::testing::Values(0.02),
                       ::testing::Values(Compression::kDgc, Compression::kNone),
                       ::testing::Values(DensePath::kGrouped), ::testing::Values(0.002)));

TEST(BucketPlan, ReverseOrderUnderTheCapWithTheDensePathGroupLast) {
  std::vector<TensorSpec> layout;
  for (const auto& [name, shape] : model_shapes()) {
    layout.push_back({name, shape, choose_path(shape, PolicyOptions{.min_numel = 256})});
  }
  OptimizerOptions options = step_options(Compression::kDgc, DensePath::kGrouped);
  options.bucket_cap_mb = 20000.0 / (1 << 20);  // 5000 floats
  const BucketPlan plan = plan_buckets(layout, options, 2);
  // fc.weight (2880) + conv3 (9216) closes the first; conv2 (4608) + conv1 (432) the second.
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0], (std::vector<size_t>{6, 7}));
  EXPECT_EQ(plan.buckets[1], (std::vector<size_t>{0, 3}));
  EXPECT_EQ(plan.buckets[2], (std::vector<size_t>{1, 2, 4, 5, 8}));
  EXPECT_TRUE(plan.one_message_reason.empty());

  // The last bucket of tensors at most 2,000 floats: conv1 (432) leaves conv2 (4608) before it.
  options.last_bucket_cap_mb = 8000.0 / (1 << 20);
  const BucketPlan cut = plan_buckets(layout, options, 2);
  ASSERT_EQ(cut.buckets.size(), 4u);
  EXPECT_EQ(cut.buckets[1], (std::vector<size_t>{3}));
  EXPECT_EQ(cut.buckets[2], (std::vector<size_t>{0}));
  EXPECT_EQ(cut.buckets[3], (std::vector<size_t>{1, 2, 4, 5, 8}));
  // A last cap below conv1's size still cuts conv1 off alone; one tensor stays as it is.
  options.last_bucket_cap_mb = 100.0 / (1 << 20);
  EXPECT_EQ(plan_buckets(layout, options, 2).buckets[2], (std::vector<size_t>{0}));
  options.bucket_cap_mb = 1.0;  // every tensor in one bucket: fc, conv3, conv2, conv1
  options.last_bucket_cap_mb = 21000.0 / (1 << 20);  // conv1 and conv2 fit, conv3 does not
  const BucketPlan whole = plan_buckets(layout, options, 2);
  ASSERT_EQ(whole.buckets.size(), 3u);
  EXPECT_EQ(whole.buckets[0], (std::vector<size_t>{6, 7}));
  EXPECT_EQ(whole.buckets[1], (std::vector<size_t>{0, 3}));
  // A last bucket within the last cap stays whole.
  options.last_bucket_cap_mb = 1.0;
  EXPECT_EQ(plan_buckets(layout, options, 2).buckets.size(), 2u);
  options.last_bucket_cap_mb = 0.0;
  options.bucket_cap_mb = 20000.0 / (1 << 20);

  options.selection_scope = SelectionScope::kGlobal;
  EXPECT_NE(plan_buckets(layout, options, 2).one_message_reason.find("global"), std::string::npos);
  options.selection_scope = SelectionScope::kTensor;
  options.clip_norm = 1.0;
  EXPECT_EQ(plan_buckets(layout, options, 2).buckets.size(), 1u);
}

// Through the libtorch optimizer: the autograd hooks start the buckets during backward.
struct Net : torch::nn::Module {
  Net()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3)))),
        fc(register_module("fc", torch::nn::Linear(32 * 4 * 4, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv2(torch::relu(conv1(x))));
    return fc(x.flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};

class BucketsThroughHooks : public ::testing::TestWithParam<std::tuple<int, Compression>> {};

TEST_P(BucketsThroughHooks, EqualTheUnbucketedOptimizer) {
  const auto [world, compression] = GetParam();
  constexpr int kSteps = 10;
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    torch::manual_seed(5);
    Net a, b;
    {
      torch::NoGradGuard no_grad;
      const auto pa = a.parameters(), pb = b.parameters();
      for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
    }
    OptimizerOptions options = step_options(compression, DensePath::kGrouped);
    DistributedOptimizer one(comm, a, options);
    options.bucket_cap_mb = 0.01;
    DistributedOptimizer bucketed(comm, b, options);
    ASSERT_GT(bucketed.bucketed_step().bucket_count(), 1u);
    torch::manual_seed(17 + comm.rank());
    for (int s = 0; s < kSteps; ++s) {
      const auto x = torch::randn({4, 3, 8, 8});
      const auto y = torch::randint(0, 10, {4});
      for (auto* pair : {&a, &b}) {
        pair->zero_grad();
        torch::nn::functional::cross_entropy(pair->forward(x), y).backward();
        // The hooks have handed every gradient over during backward: the buckets are in flight.
        if (pair == &b) {
          ASSERT_TRUE(bucketed.bucketed_step().in_flight());
        }
        (pair == &a ? one : bucketed).step();
      }
      const auto pa = a.parameters(), pb = b.parameters();
      for (size_t i = 0; i < pa.size(); ++i) {
        ASSERT_TRUE(torch::equal(pa[i], pb[i])) << "step " << s << " parameter " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, BucketsThroughHooks,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(Compression::kDgc,
                                                              Compression::kNone)));

// Checkpoints are the same records with and without buckets: 3 steps with one cap, save, a fresh
// optimizer with the other cap loads, 3 more steps equal 6 steps without buckets, bit for bit.
class BucketsCheckpoint : public ::testing::TestWithParam<bool> {};  // the first half bucketed

TEST_P(BucketsCheckpoint, ResumeWithAnotherCapEqualsTheUninterruptedRun) {
  constexpr int kWorld = 2, kSteps = 6;
  const bool bucketed_first = GetParam();
  torch::manual_seed(23);
  Net initial;
  std::vector<torch::Tensor> inputs, targets;
  for (int i = 0; i < kWorld * kSteps; ++i) {
    inputs.push_back(torch::randn({4, 3, 8, 8}));
    targets.push_back(torch::randint(0, 10, {4}));
  }
  std::vector<CheckpointFile> files(kWorld);
  const auto run = [&](int from, int to, double cap_mb, bool load, bool save) {
    std::vector<std::vector<torch::Tensor>> weights(kWorld);
    comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
      Net net;
      {
        torch::NoGradGuard no_grad;
        const auto from_params = initial.parameters(), to_params = net.parameters();
        for (size_t i = 0; i < to_params.size(); ++i) to_params[i].copy_(from_params[i]);
      }
      OptimizerOptions options = step_options(Compression::kDgc, DensePath::kGrouped);
      options.bucket_cap_mb = cap_mb;
      DistributedOptimizer optimizer(comm, net, options);
      EXPECT_EQ(optimizer.bucketed_step().bucket_count() > 1, cap_mb > 0);
      if (load) optimizer.load(files[comm.rank()]);
      for (int s = from; s < to; ++s) {
        net.zero_grad();
        const size_t at = static_cast<size_t>(s * kWorld + comm.rank());
        torch::nn::functional::cross_entropy(net.forward(inputs[at]), targets[at]).backward();
        optimizer.step();
      }
      if (save) {
        files[comm.rank()] = CheckpointFile();
        optimizer.save(files[comm.rank()]);
      }
      for (const auto& p : net.parameters()) weights[comm.rank()].push_back(p.detach().clone());
    });
    return weights;
  };
  const auto straight = run(0, kSteps, 0.0, false, false);
  run(0, kSteps / 2, bucketed_first ? 0.01 : 0.0, false, true);
  const auto resumed = run(kSteps / 2, kSteps, bucketed_first ? 0.0 : 0.01, true, false);
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < straight[r].size(); ++i) {
      EXPECT_TRUE(torch::equal(resumed[r][i], straight[r][i])) << "rank " << r << " tensor " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Order, BucketsCheckpoint, ::testing::Bool());

// Ranks with another cap stop at the first bucket's handshake, every one of them.
TEST(Buckets, RanksWithAnotherCapStopAtTheHandshake) {
  std::mutex mutex;
  std::vector<std::string> messages;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    OptimizerOptions options = step_options(Compression::kDgc, DensePath::kGrouped);
    options.bucket_cap_mb = comm.rank() == 0 ? 0.001 : 0.02;
    try {
      BucketedStep step(comm, model_shapes(), options);
    } catch (const MismatchError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what());
    }
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& message : messages) {
    EXPECT_NE(message.find("bucket_cap_mb"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace dgc::train
