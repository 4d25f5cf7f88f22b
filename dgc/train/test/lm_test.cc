// The language-modelling task: the LSTM model, perplexity before and after a few hundred steps,
// local gradient clipping (the bound per worker, the dense baseline's global bound) and DGC with
// clipping against a reference written out by hand on a small LSTM.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/models.h"
#include "dgc/train/optimizer.h"
#include "dgc/train/tasks/lm.h"
#include "dgc/train/trainer.h"

namespace dgc::train {
namespace {

namespace fs = std::filesystem;

comm::GlooOptions gloo_options() {
  comm::GlooOptions options;
  options.timeout = std::chrono::seconds(60);
  return options;
}

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

TEST(LstmLanguageModel, HasTheDocumentedSizeAndShapes) {
  LstmLanguageModel model(5000, 100, 100, 0.2, 1);
  EXPECT_EQ(parameter_count(model), 1160800);
  int64_t one_d = 0;
  for (const auto& p : model.parameters()) one_d += p.dim() == 1 ? p.numel() : 0;
  EXPECT_EQ(one_d, 800) << "only the two LSTM biases are 1-D";

  LstmLanguageModel small(50, 8, 6, 0.5, 3);
  auto state = small.initial_state(4);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto tokens = torch::randint(50, {7, 4}, torch::kInt64);
  const auto logits = small.forward(tokens, state, generator);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{28, 50}));
  EXPECT_EQ(state[1][0].sizes(), (std::vector<int64_t>{4, 6}));
  // Same seed, same weights; in evaluation mode no dropout: the same output twice.
  LstmLanguageModel again(50, 8, 6, 0.5, 3);
  const auto a = small.parameters();
  const auto b = again.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  small.eval();
  auto s1 = small.initial_state(4);
  auto s2 = small.initial_state(4);
  EXPECT_TRUE(
      torch::equal(small.forward(tokens, s1, generator), small.forward(tokens, s2, generator)));
}

// The real corpus, prepared into a temporary cache once for the suite.
class KjvTask : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("dgc_lm_test_" + std::to_string(::getpid())));
    verses_ = new std::vector<std::string>(kjv::load_verses(dir_->string()));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete verses_;
  }
  static inline fs::path* dir_ = nullptr;
  static inline std::vector<std::string>* verses_ = nullptr;
};

TEST_F(KjvTask, UntrainedPerplexityIsNearTheVocabularySizeAndTrainingLowersIt) {
  LmOptions lm;
  lm.vocabulary = 1000;
  lm.embedding = 32;
  lm.hidden = 32;
  lm.bptt = 10;
  lm.dropout = 0.0;
  const LmTask task(*verses_, lm);
  TrainOptions options;
  options.model = "lstm";
  options.epochs = 3;
  options.batch_size = 4;
  options.threads = 1;
  options.train_examples = 300;  // about 8000 tokens: 2 ranks x 4 columns x 10 = 80 per step
  options.test_examples = 100;
  options.optimizer.density.after_warmup = 0.01;
  options.optimizer.density.warmup_epochs = 1;
  options.optimizer.lr.base = 5.0;
  options.optimizer.lr.warmup_epochs = 0.2;
  options.optimizer.clip_norm = 0.25;
  options.optimizer.weight_decay = 0.0;
  std::vector<double> before(2), after(2);
  int64_t steps = 0;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, task);
    before[comm.rank()] = metric_value(trainer.evaluate(), "test_perplexity");
    const auto summary = trainer.run();
    after[comm.rank()] = metric_value(summary.evaluation, "test_perplexity");
    if (comm.rank() == 0) steps = trainer.optimizer().iteration();
    EXPECT_GT(metric_value(summary.evaluation, "validation_perplexity"), 1.0);
  });
  std::printf("perplexity %.1f untrained, %.1f after %lld steps\n", before[0], after[0],
              static_cast<long long>(steps));
  EXPECT_GE(steps, 200);
  EXPECT_EQ(before[0], before[1]) << "every rank reports the same metrics";
  EXPECT_EQ(after[0], after[1]);
  EXPECT_GT(before[0], 0.7 * 1000);
  EXPECT_LT(before[0], 1.3 * 1000);
  EXPECT_LT(after[0], 0.3 * 1000);
}

// Dropout masks and the carried state restart from (seed, rank, epoch) at every epoch, and a
// checkpoint inside an epoch carries the LSTM state and the dropout generator: a run resumed from
// the checkpoint after epoch 1, or from one inside epoch 1 or 2, equals the uninterrupted run bit
// for bit.
TEST_F(KjvTask, ResumeEqualsTheUninterruptedRunBitForBit) {
  LmOptions lm;
  lm.vocabulary = 300;
  lm.embedding = 16;
  lm.hidden = 16;
  lm.bptt = 8;
  lm.dropout = 0.3;
  const LmTask task(*verses_, lm);
  TrainOptions options;
  options.model = "lstm";
  options.epochs = 2;
  options.batch_size = 4;
  options.threads = 1;
  options.train_examples = 120;
  options.test_examples = 40;
  options.optimizer.density.after_warmup = 0.01;
  options.optimizer.lr.base = 2.0;
  options.optimizer.clip_norm = 0.25;
  options.checkpoint_every = 3;
  options.checkpoint_keep = 0;
  const std::string prefix = (*dir_ / "resume").string();
  options.checkpoint = prefix;
  std::vector<torch::Tensor> uninterrupted;
  std::vector<double> losses;
  int64_t iterations = 0;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    TrainCallbacks callbacks;
    callbacks.on_start = [&](const RunInfo& info) { iterations = info.iterations_per_epoch; };
    callbacks.on_epoch = [&](const EpochMetrics& m) { losses.push_back(m.train_loss); };
    Trainer trainer(comm, options, task);
    trainer.run(callbacks);
    if (comm.rank() == 0) uninterrupted = clone_all(trainer.model().parameters());
  });
  ASSERT_GE(iterations, 4) << "the test needs a step inside each epoch";
  // After epoch 1, the first checkpoint inside epoch 1 and the last one inside epoch 2.
  const int64_t inside_2 = (2 * iterations - 1) / 3 * 3;
  ASSERT_GT(inside_2, iterations);
  for (const int64_t step : {iterations, int64_t{3}, inside_2}) {
    const std::string copy = prefix + "_" + std::to_string(step);
    for (int r = 0; r < 2; ++r) {
      fs::copy_file(checkpoint_path(prefix, step, r), checkpoint_path(copy, step, r),
                    fs::copy_options::overwrite_existing);
    }
    TrainOptions resumed = options;
    resumed.checkpoint = copy;
    resumed.resume = true;  // the newest: the only step copied
    std::vector<torch::Tensor> result;
    std::vector<double> resumed_losses;
    comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
      Trainer trainer(comm, resumed, task);
      EXPECT_EQ(trainer.start_iteration(), step);
      TrainCallbacks callbacks;
      callbacks.on_epoch = [&](const EpochMetrics& m) { resumed_losses.push_back(m.train_loss); };
      trainer.run(callbacks);
      if (comm.rank() == 0) result = clone_all(trainer.model().parameters());
    });
    ASSERT_EQ(result.size(), uninterrupted.size());
    for (size_t i = 0; i < result.size(); ++i) {
      EXPECT_TRUE(torch::equal(result[i], uninterrupted[i]))
          << "resumed at step " << step << ": parameter " << i;
    }
    const auto first = static_cast<size_t>(step / iterations);
    EXPECT_EQ(resumed_losses,
              std::vector<double>(losses.begin() + static_cast<long>(first), losses.end()))
        << "resumed at step " << step;
  }
}

TEST_F(KjvTask, RejectsTooLittleDataAndOtherModels) {
  LmOptions lm;
  lm.vocabulary = 100;
  lm.embedding = 4;
  lm.hidden = 4;
  const LmTask task(*verses_, lm);
  TrainOptions options;
  options.model = "lstm";
  options.train_examples = 3;
  EXPECT_THROW(task.make_worker(options, 0, 4), InvalidArgument);
  options.train_examples = 0;
  options.model = "cnn";
  EXPECT_THROW(task.make_worker(options, 0, 4), InvalidArgument);
  // The streams of the first N verses are prefixes of the whole stream.
  int64_t verses = 0;
  const auto all = task.stream(kjv::Part::kTrain, 0, &verses);
  const auto head = task.stream(kjv::Part::kTrain, 10, &verses);
  EXPECT_EQ(verses, 10);
  EXPECT_EQ(std::count(head.begin(), head.end(), kjv::kEos), 10);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), all.begin()));
}

// The per-word analysis (dgc lm-words): a model loaded from a run's checkpoint and evaluated
// token by token in the run's layout gives the run's own test perplexity; the frequency bands
// cover every id once; a checkpoint of another size is refused.
TEST_F(KjvTask, TokenLossesFromACheckpointReproduceTheRunsPerplexity) {
  LmOptions lm;
  lm.vocabulary = 300;
  lm.embedding = 16;
  lm.hidden = 16;
  lm.bptt = 8;
  lm.dropout = 0.3;
  const LmTask task(*verses_, lm);
  TrainOptions options;
  options.model = "lstm";
  options.epochs = 1;
  options.batch_size = 3;
  options.threads = 1;
  options.train_examples = 120;
  options.test_examples = 40;
  options.optimizer.density.after_warmup = 0.01;
  options.optimizer.lr.base = 2.0;
  options.optimizer.clip_norm = 0.25;
  const std::string prefix = (*dir_ / "words").string();
  options.checkpoint = prefix;
  double run_perplexity = 0.0;
  int64_t steps = 0;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, task);
    const auto summary = trainer.run();
    if (comm.rank() == 0) {
      run_perplexity = metric_value(summary.evaluation, "test_perplexity");
      steps = trainer.optimizer().iteration();
    }
  });
  LstmLanguageModel model(300, 16, 16, 0.0, 99);  // other initial weights, no dropout
  load_model_parameters(CheckpointFile::read(checkpoint_path(prefix, steps, 1)), model);
  const auto losses = token_losses(task, model, kjv::Part::kTest, 40, 2, 3);
  const auto stream = task.stream(kjv::Part::kTest, 40);
  const int64_t rows = static_cast<int64_t>(stream.size()) / 2 / 3;
  ASSERT_EQ(losses.nll.size(), static_cast<size_t>(2 * 3 * (rows - 1)))
      << "every row of each rank's columns but the first is a target once";
  ASSERT_EQ(losses.targets.size(), losses.nll.size());
  const double mean = std::accumulate(losses.nll.begin(), losses.nll.end(), 0.0) /
                      static_cast<double>(losses.nll.size());
  EXPECT_NEAR(std::exp(mean), run_perplexity, 1e-4 * run_perplexity);
  EXPECT_TRUE(model.is_training()) << "the model's mode is restored";

  const auto bands = frequency_bands(300);
  ASSERT_EQ(bands.size(), 5u);  // <eos>, 1-10, 11-100, 101-298, <unk>
  EXPECT_EQ(bands[3].name, "words 101-298");
  std::vector<int> covered(300, 0);
  for (const auto& band : bands) {
    for (int32_t id = band.first_id; id <= band.last_id; ++id) ++covered[static_cast<size_t>(id)];
  }
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), 300) << "every id in one band";
  EXPECT_EQ(frequency_bands(3).size(), 3u);  // <eos>, words 1-1, <unk>

  LstmLanguageModel other(300, 16, 24, 0.0, 1);
  try {
    load_model_parameters(CheckpointFile::read(checkpoint_path(prefix, steps, 0)), other);
    ADD_FAILURE() << "a checkpoint of hidden size 16 loaded into one of 24";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("another vocabulary, embedding or hidden size"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Clipping and DGC on a small LSTM.

constexpr int64_t kVocabulary = 12;
constexpr int kWorld = 2;

// Rank- and step-specific tokens [6, 3].
torch::Tensor tokens_for(int rank, int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + 10 * step + rank);
  return torch::randint(kVocabulary, {6, 3}, generator, torch::kInt64);
}

// Gradients of the next-word loss of `tokens` (zero initial state) at the model's weights.
std::vector<torch::Tensor> gradients(LstmLanguageModel& model, const torch::Tensor& tokens) {
  model.zero_grad();
  auto state = model.initial_state(tokens.size(1));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto input = tokens.slice(0, 0, tokens.size(0) - 1);
  const auto target = tokens.slice(0, 1).reshape({-1});
  torch::nn::functional::cross_entropy(model.forward(input, state, generator), target).backward();
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.grad().detach().clone());
  return out;
}

double norm_of(const std::vector<torch::Tensor>& tensors) {
  double sum = 0.0;
  for (const auto& t : tensors) sum += t.to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

OptimizerOptions clipping_options(Compression compression, double density, double momentum,
                                  double clip_norm) {
  OptimizerOptions options;
  options.compression = compression;
  options.policy.min_numel = 16;           // every 2-D tensor compressed, the biases dense
  options.dense_path = DensePath::kExact;  // the biases averaged exactly, as the reference does
  options.compressor.selection.method = SelectionMethod::kExact;
  options.compressor.momentum.factor = momentum;
  options.compressor.momentum.nesterov = false;
  options.density.after_warmup = density;
  options.density.warmup_epochs = 0;
  options.iterations_per_epoch = 1;
  options.lr.base = 0.5;
  options.lr.warmup_epochs = 0;
  options.lr.decay = LearningRateSchedule::Decay::kConstant;
  options.weight_decay = 0.0;
  options.clip_norm = clip_norm;
  return options;
}

// Every rank computes the same gradient (rank 0's tokens): with density 1 and no momentum the
// step moves the weights by -lr x (the clipped gradient). Its norm must be the local limit with
// DGC -- clip_norm / sqrt(N) on each worker's share g / N (paper scaling, the default), i.e.
// clip_norm * sqrt(N) on g, or clip_norm / sqrt(N) on g (mean scaling) -- and at most clip_norm
// with the dense baseline (global).
TEST(LocalClipping, BoundsEachWorkersGradientAtTheScaledThreshold) {
  LstmLanguageModel probe(kVocabulary, 5, 6, 0.0, 4);
  const double raw = norm_of(gradients(probe, tokens_for(0, 0)));
  struct Case {
    Compression compression;
    ClipScaling scaling;
    double clip_norm;
    double expected;  // the norm of the step / lr
  };
  const double root = std::sqrt(static_cast<double>(kWorld));
  const std::vector<Case> cases = {
      // clip_norm / sqrt(2) < raw < clip_norm: DGC (mean scaling) clips, dense does not.
      {Compression::kDgc, ClipScaling::kMeanGradient, raw * 1.2, raw * 1.2 / root},
      {Compression::kNone, ClipScaling::kMeanGradient, raw * 1.2, raw},
      // clip_norm * sqrt(2) < raw: the paper's scaling clips g at clip_norm * sqrt(2).
      {Compression::kDgc, ClipScaling::kPaper, raw / 2.0, raw / 2.0 * root},
      {Compression::kNone, ClipScaling::kPaper, raw / 2.0, raw / 2.0},
  };
  for (const auto& c : cases) {
    std::vector<double> moved(kWorld);
    comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
      LstmLanguageModel model(kVocabulary, 5, 6, 0.0, 4);
      auto options = clipping_options(c.compression, 1.0, 0.0, c.clip_norm);
      options.clip_scaling = c.scaling;
      DistributedOptimizer optimizer(comm, model, options);
      const auto before = clone_all(model.parameters());
      gradients(model, tokens_for(0, 0));
      optimizer.step();
      std::vector<torch::Tensor> delta;
      const auto after = model.parameters();
      for (size_t i = 0; i < after.size(); ++i) delta.push_back((before[i] - after[i]) / 0.5);
      moved[comm.rank()] = norm_of(delta);
    });
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_NEAR(moved[r], c.expected, 1e-4 * raw)
          << "rank " << r << ", compression " << to_string(c.compression) << ", scaling "
          << to_string(c.scaling);
    }
  }
}

TEST(LocalClipping, DgcWithClippingEqualsTheReferenceWrittenByHand) {
  constexpr int kSteps = 4;
  constexpr double kDensity = 0.1;
  constexpr float kM = 0.9f;
  constexpr float kLr = 0.5f;
  LstmLanguageModel reference(kVocabulary, 5, 6, 0.0, 9);
  const auto initial = clone_all(reference.parameters());
  // The default (paper) scaling: each worker's share g / N clipped at clip_norm / sqrt(N), i.e.
  // g at clip_norm * sqrt(N). Threshold below the gradients' norms so that clipping acts.
  const double clip_norm = 0.25 * norm_of(gradients(reference, tokens_for(0, 0)));
  const double limit = clip_norm * std::sqrt(static_cast<double>(kWorld));

  // The reference: per rank, clip (norm over all tensors), momentum correction, exact top-k,
  // masking; average the sent values; dense tensors: average, momentum SGD.
  auto params = reference.parameters();
  const size_t count = params.size();
  std::vector<std::vector<torch::Tensor>> u(kWorld), v(kWorld);
  std::vector<torch::Tensor> dense_momentum(count);
  for (int r = 0; r < kWorld; ++r) {
    for (const auto& p : params) {
      u[r].push_back(torch::zeros_like(p));
      v[r].push_back(torch::zeros_like(p));
    }
  }
  for (size_t i = 0; i < count; ++i) dense_momentum[i] = torch::zeros_like(params[i]);
  int clipped_steps = 0;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> update(count), dense_sum(count);
    for (size_t i = 0; i < count; ++i) {
      update[i] = torch::zeros_like(params[i]);
      dense_sum[i] = torch::zeros_like(params[i]);
    }
    for (int r = 0; r < kWorld; ++r) {
      auto g = gradients(reference, tokens_for(r, s));
      const double norm = norm_of(g);
      if (norm > limit) {
        ++clipped_steps;
        for (auto& t : g) t.mul_(static_cast<float>(limit / norm));
      }
      for (size_t i = 0; i < count; ++i) {
        if (params[i].dim() == 1) {
          dense_sum[i] += g[i];
          continue;
        }
        auto uf = u[r][i].view({-1});
        auto vf = v[r][i].view({-1});
        const auto gf = g[i].view({-1});
        const int64_t n = uf.numel();
        float* pu = uf.data_ptr<float>();
        float* pv = vf.data_ptr<float>();
        const float* pg = gf.data_ptr<float>();
        for (int64_t e = 0; e < n; ++e) {
          pu[e] = kM * pu[e] + pg[e];
          pv[e] = pv[e] + pu[e];
        }
        std::vector<int64_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return std::abs(pv[a]) > std::abs(pv[b]); });
        const auto k = static_cast<size_t>(std::ceil(kDensity * static_cast<double>(n)));
        float* pupdate = update[i].view({-1}).data_ptr<float>();
        for (size_t j = 0; j < k; ++j) {
          const int64_t e = order[j];
          pupdate[e] += pv[e] / kWorld;
          pv[e] = 0.0f;
          pu[e] = 0.0f;
        }
      }
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < count; ++i) {
      if (params[i].dim() == 1) {
        dense_momentum[i] = kM * dense_momentum[i] + dense_sum[i] / kWorld;
        params[i] -= kLr * dense_momentum[i];
      } else {
        params[i] -= kLr * update[i];
      }
    }
  }
  EXPECT_GE(clipped_steps, kSteps) << "clipping must act for the test to mean something";

  std::vector<std::vector<torch::Tensor>> results(kWorld);
  comm::run_local(kWorld, gloo_options(), [&](comm::Communicator& comm) {
    LstmLanguageModel model(kVocabulary, 5, 6, 0.0, 9);
    DistributedOptimizer optimizer(comm, model,
                                   clipping_options(Compression::kDgc, kDensity, kM, clip_norm));
    for (int s = 0; s < kSteps; ++s) {
      gradients(model, tokens_for(comm.rank(), s));
      optimizer.step();
    }
    results[comm.rank()] = clone_all(model.parameters());
  });
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_TRUE(torch::allclose(results[r][i], params[i], 1e-4, 1e-6))
          << "rank " << r << " parameter " << i << " max difference "
          << (results[r][i] - params[i]).abs().max().item<float>();
      EXPECT_FALSE(torch::equal(results[r][i], initial[i])) << "parameter " << i << " moved";
    }
  }
}

}  // namespace
}  // namespace dgc::train
