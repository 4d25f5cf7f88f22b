// The distributed optimizer against references written out by hand: dense SGD on the
// concatenated batch (compression none), the DGC update with exact top-k (compression dgc), and
// a non-finite gradient on one rank.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dgc/comm/launch.h"
#include "dgc/core/codec.h"
#include "dgc/core/compressor.h"
#include "dgc/core/error.h"
#include "dgc/train/buckets.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/optimizer.h"

namespace dgc {
// Readable parameter names in test listings.
void PrintTo(ExchangeAlgorithm algorithm, std::ostream* os) { *os << to_string(algorithm); }
}  // namespace dgc

namespace dgc::train {
namespace {

comm::GlooOptions gloo_options() {
  comm::GlooOptions options;
  options.timeout = std::chrono::seconds(30);
  return options;
}

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

void copy_into(torch::nn::Module& module, const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  auto params = module.parameters();
  ASSERT_EQ(params.size(), values.size());
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
}

// ---------------------------------------------------------------------------------------------
// Compression none == single-worker momentum SGD on the concatenated batch.

struct SmallNet : torch::nn::Module {
  SmallNet()
      : fc1(register_module("fc1", torch::nn::Linear(6, 12))),
        fc2(register_module("fc2", torch::nn::Linear(12, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

struct DenseCase {
  int world;
  bool nesterov;
  double weight_decay;
};

class DenseOptimizer : public ::testing::TestWithParam<DenseCase> {};

TEST_P(DenseOptimizer, EqualsSingleWorkerSgdOnTheConcatenatedBatch) {
  const auto [world, nesterov, weight_decay] = GetParam();
  constexpr int64_t kBatch = 5;  // per worker
  constexpr int kSteps = 6;
  constexpr double kLr = 0.05;
  torch::manual_seed(11);
  SmallNet reference;
  const auto initial = clone_all(reference.parameters());
  std::vector<torch::Tensor> inputs, targets;
  for (int s = 0; s < kSteps; ++s) {
    inputs.push_back(torch::randn({world * kBatch, 6}));
    targets.push_back(torch::randint(0, 3, {world * kBatch}));
  }

  torch::optim::SGD sgd(
      reference.parameters(),
      torch::optim::SGDOptions(kLr).momentum(0.9).nesterov(nesterov).weight_decay(weight_decay));
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference.forward(inputs[s]), targets[s]).backward();
    sgd.step();
  }

  OptimizerOptions options;
  options.compression = Compression::kNone;
  options.compressor.momentum.factor = 0.9;
  options.compressor.momentum.nesterov = nesterov;
  options.weight_decay = weight_decay;
  options.lr.base = kLr;
  options.lr.warmup_epochs = 0;
  options.lr.decay = LearningRateSchedule::Decay::kConstant;
  std::vector<std::vector<torch::Tensor>> results(static_cast<size_t>(world));
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    SmallNet net;
    if (comm.rank() == 0) copy_into(net, initial);  // the others get rank 0's by broadcast
    DistributedOptimizer optimizer(comm, net, options);
    for (const auto& spec : optimizer.layout()) EXPECT_EQ(spec.path, TensorPath::kDense);
    for (int s = 0; s < kSteps; ++s) {
      net.zero_grad();
      const auto x = inputs[s].narrow(0, comm.rank() * kBatch, kBatch);
      const auto y = targets[s].narrow(0, comm.rank() * kBatch, kBatch);
      torch::nn::functional::cross_entropy(net.forward(x), y).backward();
      optimizer.step();
    }
    EXPECT_EQ(optimizer.iteration(), kSteps);
    results[static_cast<size_t>(comm.rank())] = clone_all(net.parameters());
  });

  const auto expected = reference.parameters();
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(results[r][i], expected[i], 1e-5, 1e-6))
          << "rank " << r << " tensor " << i << " max diff "
          << (results[r][i] - expected[i]).abs().max().item<float>();
      EXPECT_TRUE(torch::equal(results[r][i], results[0][i])) << "ranks disagree";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DenseOptimizer,
                         ::testing::Values(DenseCase{1, false, 0.0}, DenseCase{2, true, 1e-3},
                                           DenseCase{4, false, 1e-2}),
                         [](const auto& p) {
                           return "World" + std::to_string(p.param.world) +
                                  (p.param.nesterov ? "Nesterov" : "Plain");
                         });

// ---------------------------------------------------------------------------------------------
// Compression dgc == momentum correction, exact top-k, masking and averaging written by hand.

constexpr int64_t kRows = 8;
constexpr int64_t kCols = 10;
constexpr int64_t kWeights = kRows * kCols;

struct Tiny : torch::nn::Module {
  Tiny() {
    weight = register_parameter("weight", torch::zeros({kRows, kCols}));
    bias = register_parameter("bias", torch::zeros({kRows}));
  }
  torch::Tensor weight, bias;
};

// Rank-distinct gradients in closed form; no ties in magnitude.
std::vector<float> gradient(int rank, int step, int64_t n, double salt) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = static_cast<float>(
        std::sin(0.37 * static_cast<double>(i) + 1.3 * rank + 2.1 * step + salt) *
        (1.0 + 0.1 * static_cast<double>((i * 7 + rank) % 5)));
  }
  return g;
}

void set_gradients(Tiny& model, int rank, int step) {
  const auto gw = gradient(rank, step, kWeights, 0.0);
  const auto gb = gradient(rank, step, kRows, 0.5);
  model.weight.mutable_grad() = torch::tensor(gw).reshape({kRows, kCols});
  model.bias.mutable_grad() = torch::tensor(gb);
}

std::vector<float> to_vector(const torch::Tensor& t) {
  const auto c = t.detach().contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

OptimizerOptions dgc_options(bool nesterov, SelectionMethod method) {
  OptimizerOptions options;
  options.compression = Compression::kDgc;
  options.policy.min_numel = 16;  // weight (80) compressed, bias (8) dense
  options.compressor.selection.method = method;
  options.compressor.momentum.factor = 0.9;
  options.compressor.momentum.nesterov = nesterov;
  options.density.after_warmup = 0.05;  // k = 4 of 80
  options.density.warmup_epochs = 1;    // first epoch (2 iterations): density 0.25, k = 20
  options.iterations_per_epoch = 2;
  options.lr.base = 0.1;
  options.lr.warmup_epochs = 0;
  options.lr.decay = LearningRateSchedule::Decay::kConstant;
  options.weight_decay = 0.01;
  options.dense_path = DensePath::kExact;  // the bias: exact average, ordinary momentum SGD
  return options;
}

// (Nesterov, the learning rate inside the velocity). The schedule has a warm-up and a cosine
// decay, so that lr_in_velocity changes every step's scale.
class DgcOptimizer : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(DgcOptimizer, EqualsTheReferenceWrittenByHand) {
  const auto [nesterov, lr_in_velocity] = GetParam();
  constexpr int kWorld = 3;
  constexpr int kSteps = 5;
  const float m = 0.9f, wd = 0.01f;
  OptimizerOptions options = dgc_options(nesterov, SelectionMethod::kExact);
  options.lr.warmup_epochs = 1;  // 2 iterations
  options.lr.decay = LearningRateSchedule::Decay::kCosine;
  options.lr.total_epochs = 3;
  options.lr_in_velocity = lr_in_velocity;
  std::vector<float> w0(kWeights), b0(kRows);
  for (int64_t i = 0; i < kWeights; ++i) w0[i] = 0.01f * static_cast<float>((i * 13) % 17 - 8);
  for (int64_t i = 0; i < kRows; ++i) b0[i] = 0.1f * static_cast<float>(i - 4);

  // The reference.
  std::vector<float> w = w0, bias = b0, decay_momentum(kWeights, 0.0f), bias_momentum(kRows, 0.0f);
  std::vector<std::vector<float>> u(kWorld, std::vector<float>(kWeights, 0.0f));
  std::vector<std::vector<float>> v = u;
  for (int s = 0; s < kSteps; ++s) {
    const double density = s < 2 ? 0.25 : 0.05;
    const auto k = static_cast<size_t>(std::ceil(density * kWeights));
    // lr_in_velocity: every gradient and the decay term enter scaled by lr_s / lr, and the
    // update is applied at lr; otherwise they enter as they are and the update is applied at lr_s.
    const auto lr_s = static_cast<float>(lr_at(options.lr, s, options.iterations_per_epoch));
    const auto base = static_cast<float>(options.lr.base);
    const float scale = lr_in_velocity ? lr_s / base : 1.0f;
    const float lr = lr_in_velocity ? base : lr_s;
    std::vector<float> update(kWeights, 0.0f);
    std::vector<float> bias_sum(kRows, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      auto g = gradient(r, s, kWeights, 0.0);
      for (auto& x : g) x *= scale;
      for (int64_t i = 0; i < kWeights; ++i) {
        if (nesterov) {
          u[r][i] = m * (u[r][i] + g[i]);
          v[r][i] = v[r][i] + u[r][i] + g[i];
        } else {
          u[r][i] = m * u[r][i] + g[i];
          v[r][i] = v[r][i] + u[r][i];
        }
      }
      std::vector<int64_t> order(kWeights);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return std::abs(v[r][a]) > std::abs(v[r][b]); });
      for (size_t j = 0; j < k; ++j) {
        const int64_t i = order[j];
        update[i] += v[r][i] / kWorld;
        v[r][i] = 0.0f;
        u[r][i] = 0.0f;
      }
      const auto gb = gradient(r, s, kRows, 0.5);
      for (int64_t i = 0; i < kRows; ++i) bias_sum[i] += scale * gb[i];
    }
    for (int64_t i = 0; i < kWeights; ++i) {
      const float decay = scale * wd * w[i];
      decay_momentum[i] = m * decay_momentum[i] + decay;
      const float d = nesterov ? decay + m * decay_momentum[i] : decay_momentum[i];
      w[i] -= lr * (d + update[i]);
    }
    for (int64_t i = 0; i < kRows; ++i) {
      const float g = bias_sum[i] / kWorld + scale * wd * bias[i];
      bias_momentum[i] = m * bias_momentum[i] + g;
      bias[i] -= lr * (nesterov ? g + m * bias_momentum[i] : bias_momentum[i]);
    }
  }

  // The optimizer.
  std::vector<std::vector<float>> weights(kWorld), biases(kWorld), velocities(kWorld),
      momenta(kWorld);
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    if (comm.rank() == 0) {
      torch::NoGradGuard no_grad;
      model.weight.copy_(torch::tensor(w0).reshape({kRows, kCols}));
      model.bias.copy_(torch::tensor(b0));
    }
    DistributedOptimizer optimizer(comm, model, options);
    ASSERT_EQ(optimizer.layout()[0].path, TensorPath::kCompressed);
    ASSERT_EQ(optimizer.layout()[1].path, TensorPath::kDense);
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_DOUBLE_EQ(optimizer.density(), s < 2 ? 0.25 : 0.05);
      set_gradients(model, comm.rank(), s);
      optimizer.step();
    }
    const auto r = static_cast<size_t>(comm.rank());
    weights[r] = to_vector(model.weight);
    biases[r] = to_vector(model.bias);
    const auto vel = optimizer.compressor()->velocity(0);
    const auto mom = optimizer.compressor()->momentum(0);
    velocities[r].assign(vel.begin(), vel.end());
    momenta[r].assign(mom.begin(), mom.end());
  });

  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kWeights; ++i) {
      ASSERT_NEAR(weights[r][i], w[i], 1e-5) << "rank " << r << " weight " << i;
      ASSERT_NEAR(velocities[r][i], v[r][i], 1e-5) << "rank " << r << " velocity " << i;
      ASSERT_NEAR(momenta[r][i], u[r][i], 1e-5) << "rank " << r << " momentum " << i;
    }
    for (int64_t i = 0; i < kRows; ++i) ASSERT_NEAR(biases[r][i], bias[i], 1e-5) << i;
    EXPECT_EQ(weights[r], weights[0]) << "ranks must hold identical weights";
  }
}

INSTANTIATE_TEST_SUITE_P(Momentum, DgcOptimizer,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param) ? "Nesterov" : "Plain") +
                                  (std::get<1>(p.param) ? "LrInVelocity" : "LrOutside");
                         });

// lr_in_velocity is refused without DGC (dense training has no velocity) and with lr 0.
TEST(DgcOptimizer, LrInVelocityNeedsDgcAndABaseRate) {
  comm::run_local(1, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    OptimizerOptions dense;
    dense.compression = Compression::kNone;
    dense.lr_in_velocity = true;
    EXPECT_THROW((DistributedOptimizer{comm, model, dense}), InvalidArgument);
    OptimizerOptions zero = dgc_options(false, SelectionMethod::kExact);
    zero.lr_in_velocity = true;
    zero.lr.base = 0.0;
    EXPECT_THROW((DistributedOptimizer{comm, model, zero}), InvalidArgument);
  });
}

// Nothing is lost through the optimizer, whatever the exchange algorithm: with momentum 0 and no
// weight decay, every rank's velocity accumulates its gradient, and the weights move by lr times
// the average of what the ranks applied. So
//   (w0 - w_final) / lr == sum over ranks of (sum of its gradients - its final velocity) / N.
// sparse-allreduce hands unapplied elements back into the velocity; if they were dropped, the
// left side would fall short of the right.
class DgcOptimizerExchange : public ::testing::TestWithParam<ExchangeAlgorithm> {};

TEST_P(DgcOptimizerExchange, WeightsMoveByExactlyWhatLeftTheVelocities) {
  constexpr int kWorld = 3;
  constexpr int kSteps = 6;
  std::vector<std::vector<float>> weights(kWorld), velocities(kWorld);
  std::vector<float> w0;
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    OptimizerOptions options = dgc_options(false, SelectionMethod::kExact);
    options.compressor.momentum.factor = 0.0;
    options.weight_decay = 0.0;
    options.exchange = GetParam();
    DistributedOptimizer optimizer(comm, model, options);
    if (comm.rank() == 0) w0 = to_vector(model.weight);
    for (int s = 0; s < kSteps; ++s) {
      set_gradients(model, comm.rank(), s);
      optimizer.step();
    }
    const auto r = static_cast<size_t>(comm.rank());
    weights[r] = to_vector(model.weight);
    const auto vel = optimizer.compressor()->velocity(0);
    velocities[r].assign(vel.begin(), vel.end());
  });
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(weights[r], weights[0]) << "rank " << r;
  const float lr = 0.1f;
  for (int64_t i = 0; i < kWeights; ++i) {
    double left = 0.0;
    for (int r = 0; r < kWorld; ++r) {
      double gradients = 0.0;
      for (int s = 0; s < kSteps; ++s) gradients += gradient(r, s, kWeights, 0.0)[i];
      left += gradients - velocities[r][i];
    }
    EXPECT_NEAR((w0[i] - weights[0][i]) / lr, left / kWorld, 1e-4) << "weight " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, DgcOptimizerExchange,
                         ::testing::Values(ExchangeAlgorithm::kAllgather,
                                           ExchangeAlgorithm::kDirect,
                                           ExchangeAlgorithm::kSparseAllreduce),
                         [](const auto& p) {
                           std::string name = to_string(p.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(DgcOptimizer, CountsBytesAsThePaperDoes) {
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    DistributedOptimizer optimizer(comm, model, dgc_options(false, SelectionMethod::kExact));
    for (int s = 0; s < 3; ++s) {
      set_gradients(model, comm.rank(), s);
      optimizer.step();
    }
    const auto& last = optimizer.last_bytes();
    EXPECT_EQ(last.dense_gradient, 4u * (kWeights + kRows));
    // 4 selected weights (value + index) and 8 dense floats: well below dense.
    EXPECT_GT(last.message, 4u * kRows);
    EXPECT_LT(last.message, last.dense_gradient);
    EXPECT_EQ(optimizer.total_bytes().dense_gradient, 3 * last.dense_gradient);
    EXPECT_EQ(optimizer.warmup_iterations(), 2);
    EXPECT_EQ(optimizer.post_warmup_bytes().message, last.message);
  });
}

// ---------------------------------------------------------------------------------------------
// Dense-path strategies on a small model with BatchNorm, against references written by hand.

// fc.weight (80, compressed), then fc.bias, bn.weight, bn.bias (8 each): a dense path of 24.
struct NormNet : torch::nn::Module {
  NormNet()
      : fc(register_module("fc", torch::nn::Linear(kCols, kRows))),
        bn(register_module("bn", torch::nn::BatchNorm1d(kRows))) {}
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
};

constexpr int64_t kDenseNumel = 3 * kRows;
const std::array<int64_t, 4> kNormNetNumels = {kWeights, kRows, kRows, kRows};

// Parameter p's initial values and the gradient of rank r at step s, in closed form.
std::vector<float> initial_values(size_t p) {
  std::vector<float> w(static_cast<size_t>(kNormNetNumels[p]));
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = 0.01f * static_cast<float>(static_cast<int>((i * 13 + p * 5) % 17) - 8);
  }
  return w;
}
std::vector<float> norm_gradient(size_t p, int rank, int step) {
  return gradient(rank, step, kNormNetNumels[p], 0.5 * static_cast<double>(p));
}

void set_norm_gradients(NormNet& model, int rank, int step) {
  auto params = model.parameters();
  for (size_t p = 0; p < params.size(); ++p) {
    params[p].mutable_grad() =
        torch::tensor(norm_gradient(p, rank, step)).reshape(params[p].sizes());
  }
}

OptimizerOptions dense_path_options(DensePath dense_path) {
  OptimizerOptions options = dgc_options(false, SelectionMethod::kExact);
  options.dense_path = dense_path;
  options.dense_path_density = 0.1;  // k = 3 of 24 after warm-up, 6 (density 0.25) before
  return options;
}

// Ranks' u, v and selection by exact top-k (ties to the lower index), sum / N into `update`,
// masking: the DGC step of docs/algorithm.md, written out.
void reference_dgc(std::vector<float>& u, std::vector<float>& v, const std::vector<float>& g,
                   double density, int world, float m, std::vector<float>& update) {
  const size_t n = g.size();
  for (size_t i = 0; i < n; ++i) {
    u[i] = m * u[i] + g[i];
    v[i] = v[i] + u[i];
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return std::abs(v[a]) > std::abs(v[b]); });
  const auto k = static_cast<size_t>(std::ceil(density * static_cast<double>(n)));
  for (size_t j = 0; j < k; ++j) {
    const size_t i = order[j];
    update[i] += v[i] / static_cast<float>(world);
    v[i] = 0.0f;
    u[i] = 0.0f;
  }
}

struct DensePathCase {
  DensePath dense_path;
  int world;
};

class DensePathStrategy : public ::testing::TestWithParam<DensePathCase> {};

TEST_P(DensePathStrategy, EqualsTheReferenceWrittenByHand) {
  const auto [dense_path, world] = GetParam();
  constexpr int kSteps = 5;
  const float m = 0.9f, lr = 0.1f, wd = 0.01f;
  const auto type = dense_path == DensePath::kFloat16 ? ValueType::kFloat16 : ValueType::kBFloat16;

  // The reference. params[0] is compressed; params[1..3] are the dense path, also as one group.
  std::vector<std::vector<float>> params(4);
  for (size_t p = 0; p < 4; ++p) params[p] = initial_values(p);
  std::vector<float> decay_momentum(kWeights, 0.0f), group_decay_momentum(kDenseNumel, 0.0f);
  std::vector<float> dense_momentum(kDenseNumel, 0.0f);
  const auto per_rank = [&](size_t n) {
    return std::vector<std::vector<float>>(static_cast<size_t>(world), std::vector<float>(n, 0.0f));
  };
  auto u = per_rank(kWeights), v = per_rank(kWeights);
  auto group_u = per_rank(kDenseNumel), group_v = per_rank(kDenseNumel);
  auto residual = per_rank(kDenseNumel);
  const auto decayed_update = [&](std::vector<float>& w, size_t w_at, std::vector<float>& b,
                                  size_t b_at, const std::vector<float>& update, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const float decay = wd * w[w_at + i];
      b[b_at + i] = m * b[b_at + i] + decay;
      w[w_at + i] -= lr * (b[b_at + i] + update[b_at + i]);
    }
  };
  for (int s = 0; s < kSteps; ++s) {
    std::vector<float> update(kWeights, 0.0f), group_update(kDenseNumel, 0.0f);
    std::vector<float> dense_sum(kDenseNumel, 0.0f);
    for (int r = 0; r < world; ++r) {
      reference_dgc(u[r], v[r], norm_gradient(0, r, s), s < 2 ? 0.25 : 0.05, world, m, update);
      std::vector<float> group;  // fc.bias, bn.weight, bn.bias: the layout order
      for (size_t p = 1; p < 4; ++p) {
        const auto g = norm_gradient(p, r, s);
        group.insert(group.end(), g.begin(), g.end());
      }
      if (dense_path == DensePath::kGrouped) {
        reference_dgc(group_u[r], group_v[r], group, s < 2 ? 0.25 : 0.1, world, m, group_update);
        continue;
      }
      for (size_t i = 0; i < group.size(); ++i) {
        float sent = group[i];
        if (dense_path != DensePath::kExact) {
          const float x = group[i] + residual[r][i];
          sent = round_to(x, type);
          residual[r][i] = x - sent;
        }
        dense_sum[i] += sent;
      }
    }
    decayed_update(params[0], 0, decay_momentum, 0, update, kWeights);
    for (size_t p = 1, at = 0; p < 4; at += params[p].size(), ++p) {
      if (dense_path == DensePath::kGrouped) {
        decayed_update(params[p], 0, group_decay_momentum, at, group_update, params[p].size());
        continue;
      }
      for (size_t i = 0; i < params[p].size(); ++i) {
        const float g = dense_sum[at + i] / static_cast<float>(world) + wd * params[p][i];
        dense_momentum[at + i] = m * dense_momentum[at + i] + g;
        params[p][i] -= lr * dense_momentum[at + i];
      }
    }
  }

  // The optimizer.
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(world));
  std::vector<std::vector<float>> got_group_v(static_cast<size_t>(world)),
      got_residual(static_cast<size_t>(world));
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    NormNet model;
    auto model_params = model.parameters();
    if (comm.rank() == 0) {
      torch::NoGradGuard no_grad;
      for (size_t p = 0; p < 4; ++p) {
        model_params[p].copy_(torch::tensor(initial_values(p)).reshape(model_params[p].sizes()));
      }
    }
    DistributedOptimizer optimizer(comm, model, dense_path_options(dense_path));
    ASSERT_EQ(optimizer.layout().size(), 4u);
    for (size_t p = 0; p < 4; ++p) {
      EXPECT_EQ(optimizer.layout()[p].path, p == 0 ? TensorPath::kCompressed : TensorPath::kDense);
    }
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_DOUBLE_EQ(optimizer.dense_path_density(), dense_path != DensePath::kGrouped ? 1.0
                                                       : s < 2                           ? 0.25
                                                                                         : 0.1);
      set_norm_gradients(model, comm.rank(), s);
      optimizer.step();
    }
    const auto r = static_cast<size_t>(comm.rank());
    for (const auto& p : model_params) got[r].push_back(to_vector(p));
    if (dense_path == DensePath::kGrouped) {
      ASSERT_EQ(optimizer.compressor()->num_tensors(), 2u);
      const auto gv = optimizer.compressor()->velocity(1);
      got_group_v[r].assign(gv.begin(), gv.end());
    }
    got_residual[r].assign(optimizer.dense_residual().begin(), optimizer.dense_residual().end());
  });

  for (int r = 0; r < world; ++r) {
    for (size_t p = 0; p < 4; ++p) {
      ASSERT_EQ(got[r][p].size(), params[p].size());
      for (size_t i = 0; i < params[p].size(); ++i) {
        ASSERT_NEAR(got[r][p][i], params[p][i], 1e-5)
            << "rank " << r << " parameter " << p << " element " << i;
      }
      EXPECT_EQ(got[r][p], got[0][p]) << "ranks must hold identical weights";
    }
    if (dense_path == DensePath::kGrouped) {
      for (int64_t i = 0; i < kDenseNumel; ++i) {
        ASSERT_NEAR(got_group_v[r][i], group_v[r][i], 1e-5) << "rank " << r << " group " << i;
      }
    }
    if (dense_path == DensePath::kFloat16 || dense_path == DensePath::kBFloat16) {
      ASSERT_EQ(got_residual[r].size(), static_cast<size_t>(kDenseNumel));
      for (int64_t i = 0; i < kDenseNumel; ++i) {
        ASSERT_NEAR(got_residual[r][i], residual[r][i], 1e-6) << "rank " << r << " residual " << i;
      }
    } else {
      EXPECT_TRUE(got_residual[r].empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, DensePathStrategy,
    ::testing::Values(DensePathCase{DensePath::kExact, 1}, DensePathCase{DensePath::kExact, 2},
                      DensePathCase{DensePath::kExact, 4}, DensePathCase{DensePath::kGrouped, 1},
                      DensePathCase{DensePath::kGrouped, 2}, DensePathCase{DensePath::kGrouped, 4},
                      DensePathCase{DensePath::kFloat16, 1}, DensePathCase{DensePath::kFloat16, 2},
                      DensePathCase{DensePath::kFloat16, 4}, DensePathCase{DensePath::kBFloat16, 1},
                      DensePathCase{DensePath::kBFloat16, 2},
                      DensePathCase{DensePath::kBFloat16, 4}),
    [](const auto& p) {
      return to_string(p.param.dense_path) + "World" + std::to_string(p.param.world);
    });

// The group's selection (sampled, the paper's) is DGC on the concatenated dense-path tensors: a
// Compressor given fc.weight and the concatenation, with the optimizer's seed, ends in the same
// momentum and velocity, bit for bit.
struct WideNormNet : torch::nn::Module {
  WideNormNet()
      : fc(register_module("fc", torch::nn::Linear(50, 40))),
        bn(register_module("bn", torch::nn::BatchNorm1d(40))) {
    scale = register_parameter("scale", torch::zeros({3000}));
  }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
  torch::Tensor scale;
};

class GroupedSelection : public ::testing::TestWithParam<int> {};

TEST_P(GroupedSelection, EqualsDgcOnTheConcatenatedTensor) {
  const int world = GetParam();
  constexpr int kSteps = 4;
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    WideNormNet model;
    OptimizerOptions options = dense_path_options(DensePath::kGrouped);
    options.compressor.selection.method = SelectionMethod::kSampled;
    options.policy.min_numel = 1024;  // fc.weight (2000) compressed; 40 + 80 + 3000 grouped
    options.density.after_warmup = 0.01;
    options.density.warmup_epochs = 0;
    options.dense_path_density = 0.01;
    DistributedOptimizer optimizer(comm, model, options);
    Compressor reference({2000, 3120}, optimizer.compressor()->options());
    Selection selection;
    // scale (own parameters come first), fc.weight, fc.bias, bn.weight, bn.bias.
    const auto params = model.parameters();
    ASSERT_EQ(params.size(), 5u);
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> weight_grad, group;  // the group: the dense path in layout order
      for (size_t p = 0; p < params.size(); ++p) {
        const auto g = gradient(comm.rank(), s, params[p].numel(), 0.3 * static_cast<double>(p));
        params[p].mutable_grad() = torch::tensor(g).reshape(params[p].sizes());
        auto& into = optimizer.layout()[p].path == TensorPath::kCompressed ? weight_grad : group;
        into.insert(into.end(), g.begin(), g.end());
      }
      ASSERT_EQ(weight_grad.size(), 2000u);
      optimizer.step();
      reference.step(0, weight_grad, 0.01, selection);
      reference.step(1, group, 0.01, selection);
      EXPECT_GE(selection.indices.size(), 16u);  // a real selection: about 1% of 3120
    }
    for (size_t t = 0; t < 2; ++t) {
      const std::span<const float> v = optimizer.compressor()->velocity(t),
                                   rv = reference.velocity(t);
      const std::span<const float> u = optimizer.compressor()->momentum(t),
                                   ru = reference.momentum(t);
      EXPECT_TRUE(std::equal(v.begin(), v.end(), rv.begin(), rv.end())) << "velocity " << t;
      EXPECT_TRUE(std::equal(u.begin(), u.end(), ru.begin(), ru.end())) << "momentum " << t;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GroupedSelection, ::testing::Values(1, 2));

// Global selection is DGC on the whole model concatenated in layout order, at `density` (the
// dense-path density and the policy play no part): one Compressor over all 5,120 elements, with
// the optimizer's seed, ends in the same momentum and velocity, bit for bit, warm-up included;
// every rank's weights stay equal.
class GlobalSelection : public ::testing::TestWithParam<int> {};

TEST_P(GlobalSelection, EqualsDgcOnTheWholeModelConcatenated) {
  const int world = GetParam();
  constexpr int kSteps = 6;
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    WideNormNet model;
    OptimizerOptions options = dense_path_options(DensePath::kGrouped);
    options.selection_scope = SelectionScope::kGlobal;
    options.compressor.selection.method = SelectionMethod::kSampled;
    options.density.after_warmup = 0.01;
    options.density.warmup_epochs = 1;  // stages of 2 steps: densities 0.25, 0.0625, then 0.01
    options.density.iterations_per_stage = 2;
    options.iterations_per_epoch = 4;
    options.dense_path_density = 0.5;  // not used
    DistributedOptimizer optimizer(comm, model, options);
    for (const auto& spec : optimizer.layout()) EXPECT_EQ(spec.path, TensorPath::kDense);
    Compressor reference({5120}, optimizer.compressor()->options());
    Selection selection;
    const auto params = model.parameters();
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> all;
      for (size_t p = 0; p < params.size(); ++p) {
        const auto g = gradient(comm.rank(), s, params[p].numel(), 0.3 * static_cast<double>(p));
        params[p].mutable_grad() = torch::tensor(g).reshape(params[p].sizes());
        all.insert(all.end(), g.begin(), g.end());
      }
      const double d = s < 2 ? 0.25 : s < 4 ? 0.0625 : 0.01;
      EXPECT_DOUBLE_EQ(optimizer.dense_path_density(), d) << "step " << s;
      optimizer.step();
      reference.step(0, all, d, selection);
      EXPECT_GE(selection.indices.size(), static_cast<size_t>(0.8 * d * 5120)) << "step " << s;
      EXPECT_LE(selection.indices.size(), static_cast<size_t>(1.3 * d * 5120) + 1) << "step " << s;
    }
    const std::span<const float> v = optimizer.compressor()->velocity(0),
                                 rv = reference.velocity(0);
    const std::span<const float> u = optimizer.compressor()->momentum(0),
                                 ru = reference.momentum(0);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), rv.begin(), rv.end()));
    EXPECT_TRUE(std::equal(u.begin(), u.end(), ru.begin(), ru.end()));
    for (const auto& p : params) {
      auto first = p.detach().clone();
      comm::broadcast_floats(
          comm, std::span<float>(first.data_ptr<float>(), static_cast<size_t>(first.numel())), 0);
      EXPECT_TRUE(torch::equal(first, p.detach())) << "rank " << comm.rank();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlobalSelection, ::testing::Values(1, 2));

TEST(GlobalSelection, NeedsTheGroupedDensePath) {
  comm::run_local(1, gloo_options(), [&](comm::Communicator& comm) {
    WideNormNet model;
    OptimizerOptions options = dense_path_options(DensePath::kExact);
    options.selection_scope = SelectionScope::kGlobal;
    try {
      DistributedOptimizer optimizer(comm, model, options);
      FAIL() << "global selection with the exact dense path accepted";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("needs --dense-path grouped"), std::string::npos) << message;
    }
  });
}

// Error feedback loses nothing: with momentum 0 and no weight decay the dense-path weights move by
// lr times the sum of what was sent, which must equal the sum of the exact averages minus the
// ranks' last residuals / N.
class ErrorFeedback : public ::testing::TestWithParam<DensePath> {};

TEST_P(ErrorFeedback, SentOverTStepsIsTheExactSumUpToTheLastResidual) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 12;
  const float lr = 0.1f;
  std::vector<std::vector<float>> residuals(kWorld);
  std::vector<float> before, after;  // the dense path, concatenated, on rank 0
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    NormNet model;
    OptimizerOptions options = dense_path_options(GetParam());
    options.compressor.momentum.factor = 0.0;
    options.weight_decay = 0.0;
    DistributedOptimizer optimizer(comm, model, options);
    const auto dense = [&] {
      std::vector<float> out;
      const auto params = model.parameters();
      for (size_t p = 1; p < 4; ++p) {
        const auto w = to_vector(params[p]);
        out.insert(out.end(), w.begin(), w.end());
      }
      return out;
    };
    if (comm.rank() == 0) before = dense();
    for (int s = 0; s < kSteps; ++s) {
      set_norm_gradients(model, comm.rank(), s);
      optimizer.step();
    }
    if (comm.rank() == 0) after = dense();
    residuals[comm.rank()].assign(optimizer.dense_residual().begin(),
                                  optimizer.dense_residual().end());
  });
  double largest_residual = 0.0;
  for (int64_t i = 0; i < kDenseNumel; ++i) {
    double exact = 0.0, residual = 0.0;
    for (int r = 0; r < kWorld; ++r) {
      for (int s = 0; s < kSteps; ++s) {
        std::vector<float> group;
        for (size_t p = 1; p < 4; ++p) {
          const auto g = norm_gradient(p, r, s);
          group.insert(group.end(), g.begin(), g.end());
        }
        exact += group[i] / kWorld;
      }
      residual += residuals[r][i] / kWorld;
    }
    largest_residual = std::max(largest_residual, std::abs(residual));
    const double sent = (before[i] - after[i]) / lr;
    EXPECT_NEAR(sent, exact - residual, 2e-5) << "element " << i;
  }
  // The residual term matters: leaving it out would fail the check above.
  EXPECT_GT(largest_residual, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Types, ErrorFeedback,
                         ::testing::Values(DensePath::kFloat16, DensePath::kBFloat16),
                         [](const auto& p) { return to_string(p.param); });

TEST(DensePathStrategy, RanksWithAnotherStrategyStopAtTheHandshake) {
  std::mutex mutex;
  std::vector<std::string> messages;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    NormNet model;
    const auto options =
        dense_path_options(comm.rank() == 0 ? DensePath::kGrouped : DensePath::kFloat16);
    try {
      DistributedOptimizer optimizer(comm, model, options);
    } catch (const MismatchError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what());
    }
  });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& message : messages) {
    EXPECT_NE(message.find("setting 'dense_path': rank 0 has 'grouped'; rank 1 has 'fp16'"),
              std::string::npos)
        << message;
  }
}

// A checkpoint carries the strategy's state: 3 steps, save, a fresh optimizer loads, 3 more steps
// equal 6 steps without the interruption, bit for bit.
class DensePathCheckpoint : public ::testing::TestWithParam<DensePath> {};

TEST_P(DensePathCheckpoint, ResumeEqualsTheUninterruptedRun) {
  constexpr int kWorld = 2;
  const auto options = dense_path_options(GetParam());
  std::vector<std::vector<float>> straight(kWorld), resumed(kWorld);
  std::vector<CheckpointFile> files(kWorld);
  const auto run = [&](int from, int to, bool load, bool save,
                       std::vector<std::vector<float>>* out) {
    comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
      NormNet model;
      auto model_params = model.parameters();
      {
        torch::NoGradGuard no_grad;
        for (size_t p = 0; p < 4; ++p) {
          model_params[p].copy_(torch::tensor(initial_values(p)).reshape(model_params[p].sizes()));
        }
      }
      DistributedOptimizer optimizer(comm, model, options);
      if (load) optimizer.load(files[comm.rank()]);
      for (int s = from; s < to; ++s) {
        set_norm_gradients(model, comm.rank(), s);
        optimizer.step();
      }
      if (save) {
        files[comm.rank()] = CheckpointFile();
        optimizer.save(files[comm.rank()]);
      }
      if (out) {
        for (const auto& p : model.parameters()) {
          const auto w = to_vector(p);
          (*out)[comm.rank()].insert((*out)[comm.rank()].end(), w.begin(), w.end());
        }
      }
    });
  };
  run(0, 6, false, false, &straight);
  run(0, 3, false, true, nullptr);
  run(3, 6, true, false, &resumed);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(resumed[r], straight[r]) << "rank " << r;
  if (GetParam() == DensePath::kFloat16) {
    EXPECT_TRUE(files[0].has("optimizer/dense_residual"));
  }
  if (GetParam() == DensePath::kGrouped) {
    EXPECT_TRUE(files[0].has("dgc/velocity/[dense-path group]"));
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, DensePathCheckpoint,
                         ::testing::Values(DensePath::kExact, DensePath::kGrouped,
                                           DensePath::kFloat16, DensePath::kBFloat16),
                         [](const auto& p) { return to_string(p.param); });

// Message bytes split into their parts, the dense path counted where it travels.
TEST(DensePathStrategy, CountsMessageBytesByPart) {
  for (const DensePath dense_path :
       {DensePath::kExact, DensePath::kGrouped, DensePath::kFloat16, DensePath::kBFloat16}) {
    comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
      NormNet model;
      DistributedOptimizer optimizer(comm, model, dense_path_options(dense_path));
      for (int s = 0; s < 3; ++s) {
        set_norm_gradients(model, comm.rank(), s);
        optimizer.step();
      }
      const auto& b = optimizer.last_bytes();
      EXPECT_EQ(b.message, b.message_compressed + b.message_dense_path + b.message_headers);
      EXPECT_EQ(b.message_headers, kMessageHeaderBytes);
      // fc.weight: 4 of 80 selected at ~5 bytes each, plus its entry's 3 varints.
      EXPECT_GT(b.message_compressed, 4u * 4u);
      EXPECT_LT(b.message_compressed, 4u * 8u);
      switch (dense_path) {
        case DensePath::kExact:
          EXPECT_EQ(b.message_dense_path, 4u * kDenseNumel);
          break;
        case DensePath::kFloat16:
        case DensePath::kBFloat16:
          EXPECT_EQ(b.message_dense_path, 2u * kDenseNumel);
          break;
        case DensePath::kGrouped:  // 3 of 24: 3 varints of the entry, 3 gaps, 3 fp32 values
          EXPECT_EQ(b.message_dense_path, 3u + 3u + 3u * 4u);
          break;
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------
// A non-finite gradient on one rank.

class NonFiniteGradient : public ::testing::TestWithParam<float> {};

TEST_P(NonFiniteGradient, StopsEveryRankAtTheSameStepWithNothingChanged) {
  const float bad_value = GetParam();
  constexpr int kWorld = 3;
  constexpr int kBadStep = 2;
  constexpr int kSteps = 4;
  auto options = dgc_options(true, SelectionMethod::kSampled);
  options.clip_norm = 5.0;

  // Clean run.
  std::vector<float> clean_weights;
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    DistributedOptimizer optimizer(comm, model, options);
    for (int s = 0; s < kSteps; ++s) {
      set_gradients(model, comm.rank(), s);
      optimizer.step();
    }
    if (comm.rank() == 0) clean_weights = to_vector(model.weight);
  });

  // Rank 1 gets a bad gradient at kBadStep; every rank must throw there and lose nothing.
  std::array<std::atomic<int>, kWorld> threw_at;
  for (auto& t : threw_at) t = -1;
  std::mutex mutex;
  std::vector<std::string> messages;
  std::vector<float> weights_after;
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    DistributedOptimizer optimizer(comm, model, options);
    for (int s = 0; s < kSteps; ++s) {
      set_gradients(model, comm.rank(), s);
      optimizer.step();
      if (s + 1 != kBadStep) continue;
      // The bad step.
      set_gradients(model, comm.rank(), kBadStep);
      if (comm.rank() == 1) {
        torch::NoGradGuard no_grad;
        model.bias.mutable_grad()[3] = bad_value;
      }
      const auto weight_before = model.weight.detach().clone();
      const auto bias_before = model.bias.detach().clone();
      const auto velocity = optimizer.compressor()->velocity(0);
      const auto momentum = optimizer.compressor()->momentum(0);
      const std::vector<float> velocity_before(velocity.begin(), velocity.end());
      const std::vector<float> momentum_before(momentum.begin(), momentum.end());
      try {
        optimizer.step();
      } catch (const NumericError& e) {
        threw_at[comm.rank()] = static_cast<int>(optimizer.iteration());
        std::lock_guard<std::mutex> lock(mutex);
        messages.push_back(e.what());
      }
      EXPECT_TRUE(torch::equal(model.weight, weight_before));
      EXPECT_TRUE(torch::equal(model.bias, bias_before));
      EXPECT_EQ(std::vector<float>(velocity.begin(), velocity.end()), velocity_before);
      EXPECT_EQ(std::vector<float>(momentum.begin(), momentum.end()), momentum_before);
      EXPECT_EQ(optimizer.iteration(), kBadStep);
    }
    if (comm.rank() == 0) weights_after = to_vector(model.weight);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(threw_at[r], kBadStep) << "rank " << r;
  ASSERT_EQ(messages.size(), static_cast<size_t>(kWorld));
  for (const auto& message : messages) {
    EXPECT_NE(message.find("1 of 3 rank"), std::string::npos) << message;
    EXPECT_NE(message.find("--lr"), std::string::npos) << message;
    EXPECT_NE(message.find("--clip-norm"), std::string::npos) << message;
  }
  // Nothing was lost: continuing with the good gradients gives the clean run, bit for bit.
  EXPECT_EQ(weights_after, clean_weights);
}

INSTANTIATE_TEST_SUITE_P(Values, NonFiniteGradient, ::testing::Values(std::nanf(""), INFINITY),
                         [](const auto& p) { return std::isnan(p.param) ? "NaN" : "Inf"; });

// --on-nonfinite skip through the libtorch optimizer: step() returns false on every rank, the
// weights do not move, the run goes on as the run without the bad step (its counter moved past
// it), and a checkpoint carries the skipped-step counters.
TEST(NonFiniteGradientSkip, AppliesNothingAndCheckpointsCarryTheCount) {
  constexpr int kWorld = 2;
  auto options = dgc_options(false, SelectionMethod::kSampled);
  options.on_nonfinite = NonFinitePolicy::kSkip;
  options.max_consecutive_skips = 2;
  std::vector<std::vector<float>> without(kWorld), with(kWorld);
  std::vector<CheckpointFile> files(kWorld);
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    DistributedOptimizer optimizer(comm, model, options);
    for (int s : {0, 1, 3}) {
      set_gradients(model, comm.rank(), s);
      EXPECT_TRUE(optimizer.step());
      if (s == 1) {
        // Move the counter past step 2 (as a skipped step moves it), through a checkpoint.
        CheckpointFile file;
        optimizer.save(file);
        file.put_text("optimizer/iteration", "3");
        optimizer.load(file);
      }
    }
    without[comm.rank()] = to_vector(model.weight);
  });
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    DistributedOptimizer optimizer(comm, model, options);
    for (int s = 0; s < 4; ++s) {
      set_gradients(model, comm.rank(), s);
      if (s == 2 && comm.rank() == 0) {
        torch::NoGradGuard no_grad;
        model.weight.mutable_grad()[1][2] = std::nanf("");
      }
      const auto before = to_vector(model.weight);
      const bool taken = optimizer.step();
      EXPECT_EQ(taken, s != 2) << "step " << s;
      if (s == 2) {
        EXPECT_EQ(to_vector(model.weight), before) << "the skipped step moved the weights";
        EXPECT_EQ(optimizer.skipped_steps(), 1);
        EXPECT_EQ(optimizer.last_bad_ranks(), 1);
        EXPECT_EQ(optimizer.iteration(), 3);
        files[comm.rank()] = CheckpointFile();
        optimizer.save(files[comm.rank()]);
      }
    }
    with[comm.rank()] = to_vector(model.weight);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(with[r], without[r]) << "rank " << r;
  EXPECT_EQ(files[0].text("optimizer/skipped_steps"), "1");
  EXPECT_EQ(files[0].text("optimizer/consecutive_skips"), "1");
  EXPECT_NE(files[0].text("optimizer/settings").find("on_nonfinite=skip\n"), std::string::npos);
  // A resume restores the counts (and so the bound on skips in a row).
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    DistributedOptimizer optimizer(comm, model, options);
    optimizer.load(files[comm.rank()]);
    EXPECT_EQ(optimizer.skipped_steps(), 1);
    set_gradients(model, comm.rank(), 3);
    if (comm.rank() == 1) {
      torch::NoGradGuard no_grad;
      model.bias.mutable_grad()[0] = INFINITY;
    }
    EXPECT_FALSE(optimizer.step());
    set_gradients(model, comm.rank(), 4);
    if (comm.rank() == 1) {
      torch::NoGradGuard no_grad;
      model.bias.mutable_grad()[0] = INFINITY;
    }
    EXPECT_THROW(optimizer.step(), NumericError) << "a third bad step in a row (the bound is 2)";
  });
}

TEST(DistributedOptimizer, StartsEveryRankFromRankZerosWeights) {
  std::vector<std::vector<float>> weights(3);
  comm::run_local(3, gloo_options(), [&](comm::Communicator& comm) {
    Tiny model;
    {
      torch::NoGradGuard no_grad;
      model.weight.fill_(static_cast<float>(comm.rank() + 1));
    }
    DistributedOptimizer optimizer(comm, model, dgc_options(false, SelectionMethod::kExact));
    weights[comm.rank()] = to_vector(model.weight);
  });
  for (const auto& w : weights) EXPECT_EQ(w, std::vector<float>(kWeights, 1.0f));
}

// ---------------------------------------------------------------------------------------------
// The pipelined step (options.pipeline 1) against staleness-1 DGC written out by hand: step t's
// gradient is taken at the weights without step t-1's update; that update is applied before step
// t runs (so step t's weight decay sees it, as a synchronous step's would), and flush() applies
// the last one.

void deterministic_init(SmallNet& net) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  torch::NoGradGuard no_grad;
  for (auto& p : net.parameters()) {
    float* w = p.data_ptr<float>();
    for (int64_t e = 0; e < p.numel(); ++e) w[e] = normal(rng);
  }
}

// Rank- and step-distinct regression data; the loss's gradient depends on the weights.
void pipeline_backward(SmallNet& net, int rank, int step) {
  std::mt19937 rng(static_cast<uint32_t>(100 * rank + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(8 * 6), y(8 * 3);
  for (auto& v : x) v = normal(rng);
  for (auto& v : y) v = normal(rng);
  net.zero_grad();
  const auto input = torch::from_blob(x.data(), {8, 6}).clone();
  const auto target = torch::from_blob(y.data(), {8, 3}).clone();
  torch::mse_loss(net.forward(input), target).backward();
}

bool same_parameters(SmallNet& a, SmallNet& b) {
  const auto pa = a.parameters();
  const auto pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (std::memcmp(pa[i].data_ptr<float>(), pb[i].data_ptr<float>(), pa[i].nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

TEST(PipelinedStep, EqualsStalenessOneDgcWrittenByHand) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 8;  // through the density warm-up (2 iterations) and after it
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    const int rank = comm.rank();
    OptimizerOptions options = dgc_options(/*nesterov=*/false, SelectionMethod::kSampled);
    options.pipeline = 1;
    SmallNet pipelined;
    deterministic_init(pipelined);
    {
      DistributedOptimizer optimizer(comm, pipelined, options);
      EXPECT_EQ(optimizer.bucketed_step().bucket_count(), 1u);
      for (int s = 0; s < kSteps; ++s) {
        pipeline_backward(pipelined, rank, s);
        EXPECT_NEAR(optimizer.density(), s < 2 ? 0.25 : 0.05, 1e-12) << "step " << s;
        ASSERT_TRUE(optimizer.step());
        EXPECT_EQ(optimizer.iteration(), s + 1);
      }
      optimizer.flush();
      EXPECT_GT(optimizer.total_bytes().message, 0u);
    }

    // By hand: the synchronous step of one message, its update applied one step late; meanwhile
    // this rank's own selection applied as the lookahead, taken back before the update.
    options.pipeline = 0;
    SmallNet by_hand;
    deterministic_init(by_hand);
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const auto& item : by_hand.named_parameters()) {
      shapes.emplace_back(item.key(), item.value().sizes().vec());
    }
    BucketedStep step(comm, shapes, options);
    auto params = by_hand.parameters();
    std::vector<std::vector<float>> directions;
    for (const auto& p : params) directions.emplace_back(static_cast<size_t>(p.numel()));
    const auto apply = [&](int64_t iteration) {
      const auto lr = static_cast<float>(step.update_lr_at(iteration));
      for (size_t i = 0; i < params.size(); ++i) {
        float* w = params[i].data_ptr<float>();
        for (size_t e = 0; e < directions[i].size(); ++e) w[e] -= lr * directions[i][e];
      }
    };
    std::vector<std::vector<float>> before;  // the weights before the lookahead
    size_t looked_ahead = 0;
    const auto take_back = [&] {
      for (size_t i = 0; i < params.size(); ++i) {
        std::copy(before[i].begin(), before[i].end(), params[i].data_ptr<float>());
      }
    };
    for (int s = 0; s < kSteps; ++s) {
      // At the weights without step s-1's update, with its lookahead.
      pipeline_backward(by_hand, rank, s);
      if (s > 0) {
        take_back();
        apply(s - 1);
      }
      std::vector<std::span<float>> g, d;
      std::vector<std::span<const float>> w;
      for (size_t i = 0; i < params.size(); ++i) {
        g.emplace_back(params[i].grad().data_ptr<float>(), directions[i].size());
        w.emplace_back(params[i].data_ptr<float>(), directions[i].size());
        d.emplace_back(directions[i]);
      }
      ASSERT_TRUE(step.run(g, w, d));
      before.clear();
      for (const auto& p : params) {
        before.emplace_back(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
      }
      const auto lr = static_cast<float>(step.update_lr_at(s));
      step.bucket(0).for_each_selected([&](size_t t, size_t e, float value) {
        params[t].data_ptr<float>()[e] -= lr * value;
        ++looked_ahead;
      });
    }
    take_back();
    apply(kSteps - 1);
    EXPECT_GT(looked_ahead, 0u);
    EXPECT_TRUE(same_parameters(pipelined, by_hand)) << "rank " << rank;

    // The staleness matters: the synchronous optimizer ends elsewhere.
    SmallNet synchronous;
    deterministic_init(synchronous);
    DistributedOptimizer optimizer(comm, synchronous, options);
    for (int s = 0; s < kSteps; ++s) {
      pipeline_backward(synchronous, rank, s);
      optimizer.step();
    }
    EXPECT_FALSE(same_parameters(pipelined, synchronous));
  });
}

TEST(PipelinedStep, RefusesToSkipSteps) {
  comm::run_local(1, gloo_options(), [&](comm::Communicator& comm) {
    OptimizerOptions options = dgc_options(false, SelectionMethod::kSampled);
    options.pipeline = 1;
    options.on_nonfinite = NonFinitePolicy::kSkip;
    SmallNet net;
    try {
      DistributedOptimizer optimizer(comm, net, options);
      ADD_FAILURE() << "--pipeline 1 with --on-nonfinite skip was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--on-nonfinite stop"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dgc::train
