// Training runs on real Fashion-MNIST data: learning works, checkpoint + resume is bit for bit
// the uninterrupted run, and a checkpoint of other settings is rejected.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/train/data.h"
#include "dgc/train/models.h"
#include "dgc/train/optimizer.h"
#include "dgc/train/tasks/image.h"
#include "dgc/train/trainer.h"

namespace dgc::train {
namespace {

namespace fs = std::filesystem;

comm::GlooOptions gloo_options() {
  comm::GlooOptions options;
  options.timeout = std::chrono::seconds(60);
  return options;
}

// The real data, loaded once for all tests. Fails (not skips) when missing: the set-up installs it.
class RealData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto [images, labels] = fashion_mnist_files(kDefaultDataDir, Split::kTrain);
    if (!fs::exists(images)) return;
    train_ = new ImageSet(head(load_fashion_mnist(kDefaultDataDir, Split::kTrain), 4096));
    test_ = new ImageSet(head(load_fashion_mnist(kDefaultDataDir, Split::kTest), 1000));
    task_ = new ImageTask(*train_, *test_);
  }
  static void TearDownTestSuite() {
    delete task_;
    delete train_;
    delete test_;
    train_ = test_ = nullptr;
    task_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(train_, nullptr) << "Fashion-MNIST is not in " << kDefaultDataDir
                               << ": install the Debian package dataset-fashion-mnist "
                                  "(scripts/setup.sh does)";
  }
  static inline ImageSet* train_ = nullptr;
  static inline ImageSet* test_ = nullptr;
  static inline ImageTask* task_ = nullptr;
};

std::string temp_prefix(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("dgc_trainer_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::vector<torch::Tensor> parameters_of(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST_F(RealData, ShortDgcRunBeatsChanceByFar) {
  TrainOptions options;
  options.model = "cnn";
  options.epochs = 4;
  options.batch_size = 16;
  options.threads = 1;
  options.optimizer.density.density = 0.01;
  options.optimizer.density.warmup_epochs = 1;
  options.optimizer.lr.lr = 0.05;
  // 4 workers x 16 = 64 examples per step, 64 steps per epoch, 256 steps.
  std::vector<double> accuracy(4, 0.0);
  std::vector<double> ratio(4, 0.0);
  comm::run_local(4, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, *task_);
    const auto summary = trainer.run();
    accuracy[comm.rank()] = metric_value(summary.evaluation, "test_accuracy");
    ratio[comm.rank()] = static_cast<double>(summary.post_warmup.dense_gradient) /
                         static_cast<double>(summary.post_warmup.message);
    ASSERT_EQ(summary.epochs.size(), 4u);
    EXPECT_LT(summary.epochs.back().train_loss, summary.epochs.front().train_loss);
  });
  std::printf("test accuracy after 256 steps: %.2f%%, compression ratio after warm-up %.1fx\n",
              100.0 * accuracy[0], ratio[0]);
  for (int r = 0; r < 4; ++r) {
    EXPECT_GT(accuracy[r], 0.65) << "chance is 0.10";
    EXPECT_EQ(accuracy[r], accuracy[0]) << "every rank evaluates the same model";
    EXPECT_GT(ratio[r], 20.0) << "d = 0.01 compresses the large tensors 100x";
  }
}

// Trains `epochs` epochs with checkpoints under `prefix`; copies the checkpoint files written
// after epoch `keep_after` to `<prefix>.kept.rank<r>`. Returns rank 0's final parameters.
std::vector<torch::Tensor> train_with_checkpoints(const TrainOptions& base, const Task& task,
                                                  int world,
                                                  const std::string& prefix, int keep_after,
                                                  std::vector<double>* losses) {
  TrainOptions options = base;
  options.checkpoint = prefix;
  std::vector<torch::Tensor> result;
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    TrainCallbacks callbacks;
    callbacks.on_epoch = [&](const EpochMetrics& m) {
      if (losses) losses->push_back(m.train_loss);
      if (m.epoch != keep_after) return;
      // Rank 0 reports an epoch after every rank wrote its file (barrier), and before anyone can
      // write the next one.
      for (int r = 0; r < world; ++r) {
        fs::copy_file(checkpoint_path(prefix, r), checkpoint_path(prefix + ".kept", r),
                      fs::copy_options::overwrite_existing);
      }
    };
    Trainer trainer(comm, options, task);
    trainer.run(callbacks);
    if (comm.rank() == 0) result = parameters_of(trainer.model());
  });
  return result;
}

TrainOptions resume_options() {
  TrainOptions options;
  options.model = "mlp";
  options.epochs = 3;
  options.batch_size = 16;
  options.threads = 1;
  options.train_examples = 1024;
  options.test_examples = 200;
  options.optimizer.density.density = 0.01;
  options.optimizer.density.warmup_epochs = 1;
  options.optimizer.lr.lr = 0.05;
  options.optimizer.lr.warmup_epochs = 0.5;
  options.optimizer.clip_norm = 2.0;
  return options;
}

TEST_F(RealData, ResumeEqualsTheUninterruptedRunBitForBit) {
  const auto options = resume_options();
  const std::string prefix = temp_prefix("resume");
  std::vector<double> losses;
  const auto uninterrupted =
      train_with_checkpoints(options, *task_, 2, prefix, 1, &losses);
  ASSERT_EQ(losses.size(), 3u);

  // Resume from the files written after epoch 1.
  TrainOptions resumed = options;
  resumed.checkpoint = prefix + ".kept";
  resumed.resume = true;
  std::vector<torch::Tensor> result;
  std::vector<double> resumed_losses;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, resumed, *task_);
    EXPECT_EQ(trainer.start_epoch(), 1);
    TrainCallbacks callbacks;
    callbacks.on_epoch = [&](const EpochMetrics& m) { resumed_losses.push_back(m.train_loss); };
    const auto summary = trainer.run(callbacks);
    EXPECT_EQ(summary.epochs.size(), 2u);
    if (comm.rank() == 0) result = parameters_of(trainer.model());
  });
  ASSERT_EQ(result.size(), uninterrupted.size());
  for (size_t i = 0; i < result.size(); ++i) {
    EXPECT_TRUE(torch::equal(result[i], uninterrupted[i])) << "parameter " << i;
  }
  EXPECT_EQ(resumed_losses, std::vector<double>(losses.begin() + 1, losses.end()));
  fs::remove_all(fs::path(prefix).parent_path());
}

TEST_F(RealData, ResumeRejectsACheckpointOfOtherSettingsOrWorldSize) {
  auto options = resume_options();
  options.epochs = 1;
  options.train_examples = 256;
  const std::string prefix = temp_prefix("reject");
  train_with_checkpoints(options, *task_, 2, prefix, 0, nullptr);

  auto expect_rejected = [&](const TrainOptions& changed, int world, const std::string& words) {
    TrainOptions o = changed;
    o.checkpoint = prefix;
    o.resume = true;
    try {
      comm::run_local(world, gloo_options(),
                      [&](comm::Communicator& comm) { Trainer trainer(comm, o, *task_); });
      ADD_FAILURE() << "expected dgc::DataError mentioning " << words;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  auto other_density = options;
  other_density.optimizer.density.density = 0.001;
  expect_rejected(other_density, 2, "setting 'density' is 0.01 in the checkpoint but 0.001 now");
  auto other_model = options;
  other_model.model = "cnn";
  expect_rejected(other_model, 2, "setting 'model'");
  expect_rejected(options, 3, "2 workers");

  // The same settings resume (nothing left to train: it evaluates only).
  auto same = options;
  same.checkpoint = prefix;
  same.resume = true;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, same, *task_);
    EXPECT_EQ(trainer.start_epoch(), 1);
    EXPECT_TRUE(trainer.run().epochs.empty());
  });
  fs::remove_all(fs::path(prefix).parent_path());
}

TEST(Models, HaveTheDocumentedSizesAndShapes) {
  const auto cnn = make_model("cnn", 1);
  EXPECT_GE(parameter_count(*cnn), 400000);
  EXPECT_EQ(parameter_count(*make_model("mlp", 1)), 535818);
  EXPECT_EQ(parameter_count(*make_model("resnet20", 1)), 269434);
  for (const auto& name : model_names()) {
    auto model = make_model(name, 3);
    model->eval();
    const auto logits = model->forward(torch::randn({2, 1, kImageSize, kImageSize}));
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, kNumClasses})) << name;
  }
  // Same seed, same weights.
  const auto a = make_model("cnn", 5)->parameters();
  const auto b = make_model("cnn", 5)->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  EXPECT_THROW(make_model("vgg", 1), InvalidArgument);
}

}  // namespace
}  // namespace dgc::train
