// Training runs on real Fashion-MNIST data: learning works, checkpoint + resume is bit for bit
// the uninterrupted run (after an epoch and inside one), a checkpoint of other settings is
// rejected, and a damaged or incomplete newest checkpoint is refused naming the previous good one.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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
#include "dgc/train/resume.h"
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
  options.optimizer.density.after_warmup = 0.01;
  options.optimizer.density.warmup_epochs = 1;
  options.optimizer.lr.base = 0.05;
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

// Trains with checkpoints under `prefix`, every file kept. Returns rank 0's final parameters; the
// epochs' metrics in *epochs.
std::vector<torch::Tensor> train_with_checkpoints(const TrainOptions& base, const Task& task,
                                                  int world, const std::string& prefix,
                                                  std::vector<EpochMetrics>* epochs) {
  TrainOptions options = base;
  options.checkpoint = prefix;
  options.checkpoint_keep = 0;
  std::vector<torch::Tensor> result;
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    TrainCallbacks callbacks;
    callbacks.on_epoch = [&](const EpochMetrics& m) {
      if (epochs) epochs->push_back(m);
    };
    Trainer trainer(comm, options, task);
    trainer.run(callbacks);
    if (comm.rank() == 0) result = parameters_of(trainer.model());
  });
  return result;
}

// Resumes the run saved under `prefix` from `step`; returns rank 0's final parameters and the
// resumed epochs' metrics in *epochs.
std::vector<torch::Tensor> resume_from(const TrainOptions& base, const Task& task, int world,
                                       const std::string& prefix, int64_t step,
                                       std::vector<EpochMetrics>* epochs) {
  TrainOptions options = base;
  options.checkpoint = prefix;
  options.checkpoint_keep = 0;
  options.resume = true;
  options.resume_step = step;
  std::vector<torch::Tensor> result;
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, task);
    EXPECT_EQ(trainer.start_iteration(), step);
    TrainCallbacks callbacks;
    callbacks.on_epoch = [&](const EpochMetrics& m) { epochs->push_back(m); };
    trainer.run(callbacks);
    if (comm.rank() == 0) result = parameters_of(trainer.model());
  });
  return result;
}

void expect_equal_parameters(const std::vector<torch::Tensor>& a,
                             const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": parameter " << i;
  }
}

TrainOptions resume_options() {
  TrainOptions options;
  options.model = "mlp";
  options.epochs = 3;
  options.batch_size = 16;
  options.threads = 1;
  options.train_examples = 1024;  // 2 workers x 16: 32 iterations per epoch
  options.test_examples = 200;
  options.optimizer.density.after_warmup = 0.01;
  options.optimizer.density.warmup_epochs = 1;
  options.optimizer.lr.base = 0.05;
  options.optimizer.lr.warmup_epochs = 0.5;
  options.optimizer.clip_norm = 2.0;
  return options;
}

TEST_F(RealData, ResumeEqualsTheUninterruptedRunBitForBit) {
  const auto options = resume_options();
  const std::string prefix = temp_prefix("resume");
  std::vector<EpochMetrics> whole;
  const auto uninterrupted = train_with_checkpoints(options, *task_, 2, prefix, &whole);
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(checkpoint_steps(prefix, 0), (std::vector<int64_t>{32, 64, 96}));

  // Resume from the files written after epoch 1 (step 32).
  std::vector<EpochMetrics> resumed;
  const auto result = resume_from(options, *task_, 2, prefix, 32, &resumed);
  expect_equal_parameters(result, uninterrupted, "resumed after epoch 1");
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(resumed[e].train_loss, whole[e + 1].train_loss);
    EXPECT_EQ(resumed[e].resumed_at, 0);
  }
  fs::remove_all(fs::path(prefix).parent_path());
}

// Checkpoints every 15 steps; resumed inside epoch 1 (step 15), inside epoch 2 (step 45,
// iteration 13 of 32) and inside epoch 3 (step 90): the same final weights bit for bit, and the
// resumed epoch's loss, learning rate, density and byte counts equal the uninterrupted epoch's.
TEST_F(RealData, ResumeInsideAnEpochEqualsTheUninterruptedRunBitForBit) {
  auto options = resume_options();
  options.checkpoint_every = 15;
  const std::string prefix = temp_prefix("inside");
  std::vector<EpochMetrics> whole;
  const auto uninterrupted = train_with_checkpoints(options, *task_, 2, prefix, &whole);
  ASSERT_EQ(whole.size(), 3u);
  // Every 15th step of the run inside an epoch, and every epoch's end.
  const std::vector<int64_t> expected = {15, 30, 32, 45, 60, 64, 75, 90, 96};
  EXPECT_EQ(checkpoint_steps(prefix, 0), expected);
  EXPECT_EQ(checkpoint_steps(prefix, 1), expected);

  for (const int64_t step : {15, 45, 90}) {
    // Each resume deletes the later steps' files (an abandoned branch): resume from a copy.
    const std::string copy = prefix + "_" + std::to_string(step);
    for (int r = 0; r < 2; ++r) {
      fs::copy_file(checkpoint_path(prefix, step, r), checkpoint_path(copy, step, r),
                    fs::copy_options::overwrite_existing);
    }
    std::vector<EpochMetrics> resumed;
    const auto result = resume_from(options, *task_, 2, copy, step, &resumed);
    const std::string what = "resumed at step " + std::to_string(step);
    expect_equal_parameters(result, uninterrupted, what);
    const size_t first_epoch = static_cast<size_t>(step / 32);
    ASSERT_EQ(resumed.size(), 3u - first_epoch) << what;
    for (size_t e = 0; e < resumed.size(); ++e) {
      const EpochMetrics& a = resumed[e];
      const EpochMetrics& b = whole[first_epoch + e];
      EXPECT_EQ(a.epoch, b.epoch) << what;
      EXPECT_EQ(a.train_loss, b.train_loss) << what << ", epoch " << a.epoch;
      EXPECT_EQ(a.lr, b.lr) << what;
      EXPECT_EQ(a.density, b.density) << what;
      EXPECT_EQ(a.bytes.message, b.bytes.message) << what;
      EXPECT_EQ(a.bytes.wire_sent, b.bytes.wire_sent) << what;
      EXPECT_EQ(a.bytes.dense_gradient, b.bytes.dense_gradient) << what;
      EXPECT_EQ(metric_value(a.evaluation, "test_accuracy"),
                metric_value(b.evaluation, "test_accuracy"))
          << what;
      EXPECT_EQ(a.resumed_at, e == 0 ? step % 32 : 0) << what;
    }
  }
  fs::remove_all(fs::path(prefix).parent_path());
}

// Keeps the newest 2 steps; a damaged newest checkpoint is refused on every rank naming the
// previous good step, ranks whose newest steps differ are refused, and --resume-step resumes.
TEST_F(RealData, ResumeRefusesADamagedOrIncompleteNewestCheckpoint) {
  auto options = resume_options();
  options.epochs = 1;
  options.checkpoint_every = 10;
  const std::string prefix = temp_prefix("damaged");
  options.checkpoint = prefix;
  options.checkpoint_keep = 2;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, *task_);
    trainer.run();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(checkpoint_steps(prefix, r), (std::vector<int64_t>{30, 32})) << "rank " << r;
  }
  options.resume = true;
  // Every rank throws the same error (run_local rethrows the lowest rank's): collect them all.
  auto resume_errors = [&](const TrainOptions& o) {
    std::vector<std::string> errors(2);
    try {
      comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
        try {
          Trainer trainer(comm, o, *task_);
        } catch (const Error& e) {
          errors[comm.rank()] = e.what();
          throw;
        }
      });
    } catch (const Error&) {
    }
    return errors;
  };

  // Truncated newest file of rank 1.
  const std::string newest = checkpoint_path(prefix, 32, 1);
  fs::resize_file(newest, fs::file_size(newest) / 2);
  for (const auto& error : resume_errors(options)) {
    EXPECT_NE(error.find("cannot resume from step 32: checkpoint " + newest), std::string::npos)
        << error;
    EXPECT_NE(error.find("The newest older checkpoint every rank can read is step 30"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("--resume-step 30"), std::string::npos) << error;
  }
  // A flipped byte in the middle.
  fs::remove(newest);
  fs::copy_file(checkpoint_path(prefix, 32, 0), newest);
  {
    std::fstream file(newest, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(fs::file_size(newest) / 2));
    file.put('\x5a');
  }
  for (const auto& error : resume_errors(options)) {
    EXPECT_NE(error.find("checksum"), std::string::npos) << error;
    EXPECT_NE(error.find("--resume-step 30"), std::string::npos) << error;
  }
  // Rank 1's newest file missing: a set from different steps.
  fs::remove(newest);
  for (const auto& error : resume_errors(options)) {
    EXPECT_NE(error.find("newest checkpoints are from different steps (rank 0: step 32, rank 1: "
                         "step 30)"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("--resume-step 30"), std::string::npos) << error;
  }
  // Resuming from step 30 works (and writes step 32 again).
  auto from_30 = options;
  from_30.resume_step = 30;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, from_30, *task_);
    EXPECT_EQ(trainer.start_iteration(), 30);
    trainer.run();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(checkpoint_steps(prefix, r), (std::vector<int64_t>{30, 32})) << "rank " << r;
  }
  // A step nobody has.
  auto from_7 = options;
  from_7.resume_step = 7;
  for (const auto& error : resume_errors(from_7)) {
    EXPECT_NE(error.find("no checkpoint of step 7 for rank(s) 0, 1"), std::string::npos) << error;
  }
  fs::remove_all(fs::path(prefix).parent_path());
}

TEST_F(RealData, ResumeRejectsACheckpointOfOtherSettingsOrWorldSize) {
  auto options = resume_options();
  options.epochs = 1;
  options.train_examples = 256;
  const std::string prefix = temp_prefix("reject");
  train_with_checkpoints(options, *task_, 2, prefix, nullptr);

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
  other_density.optimizer.density.after_warmup = 0.001;
  expect_rejected(other_density, 2, "setting 'density' is 0.01 in the checkpoint but 0.001 now");
  auto other_model = options;
  other_model.model = "cnn";
  expect_rejected(other_model, 2, "setting 'model'");
  expect_rejected(options, 3,
                  "no checkpoint for rank(s) 2 (files " + prefix +
                      ".step<S>.rank<r>); rank(s) 0, 1 have one: was the run written by fewer "
                      "workers? Resume with the same number of workers");
  // Fewer workers than the checkpoint's: every rank finds its file, which names the world size.
  expect_rejected(options, 1, "was written by a run with 2 workers, this run has 1");

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

// --resume auto (resume.h): with no checkpoint every rank starts fresh (and ends where the run
// without checkpoints ends); with checkpoints it resumes from the newest complete set, also when
// a rank was lost between two ranks' writes (rank 1's newest step missing), bit for bit.
TEST_F(RealData, ResumeAutoStartsFreshWithoutCheckpointsAndResumesWithThem) {
  auto options = resume_options();
  options.checkpoint_every = 15;
  options.resume_auto = true;
  const std::string prefix = temp_prefix("auto");
  // The first attempt: nothing under the prefix.
  std::vector<torch::Tensor> uninterrupted;
  options.checkpoint = prefix;
  options.checkpoint_keep = 0;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, *task_);
    EXPECT_EQ(trainer.start_iteration(), 0);
    trainer.run();
    if (comm.rank() == 0) uninterrupted = parameters_of(trainer.model());
  });
  EXPECT_EQ(checkpoint_steps(prefix, 1),
            (std::vector<int64_t>{15, 30, 32, 45, 60, 64, 75, 90, 96}));

  // A restart after a loss at step 50 (files after 45 gone) in which rank 1 died before writing
  // step 45: the newest complete set is step 30.
  for (int r = 0; r < 2; ++r) {
    for (const int64_t s : {60, 64, 75, 90, 96}) fs::remove(checkpoint_path(prefix, s, r));
  }
  fs::remove(checkpoint_path(prefix, 45, 1));
  std::vector<torch::Tensor> resumed;
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, *task_);
    EXPECT_EQ(trainer.start_iteration(), 32) << "the newest step both ranks have";
    trainer.run();
    if (comm.rank() == 0) resumed = parameters_of(trainer.model());
  });
  expect_equal_parameters(resumed, uninterrupted, "--resume auto from step 32");

  // A set rank 0 does not have is an error on every rank, not a fresh start over it.
  fs::remove_all(fs::path(prefix).parent_path());
  fs::create_directories(fs::path(prefix).parent_path());
  std::ofstream(checkpoint_path(prefix, 15, 1)) << "x";
  try {
    comm::run_local(2, gloo_options(),
                    [&](comm::Communicator& comm) { Trainer trainer(comm, options, *task_); });
    ADD_FAILURE() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint of rank 0"), std::string::npos) << e.what();
  }
  fs::remove_all(fs::path(prefix).parent_path());
}

// An elastic restart: a 3-worker run's checkpoint of step 20 resumed by 2 workers with
// --resume auto. The 2 continue in the same epoch at the same fraction of it, the average
// velocity over the ranks is the 3 workers' (nothing dropped), and the run finishes its epochs.
TEST_F(RealData, ResumeAutoAtAnotherWorldSizeHandsTheStateOver) {
  auto options = resume_options();
  options.epochs = 2;
  options.checkpoint_every = 10;
  const std::string prefix = temp_prefix("elastic");
  train_with_checkpoints(options, *task_, 3, prefix, nullptr);
  // 1024 examples, 3 x 16: 21 full global batches and a split remainder of 16 = 22 iterations.
  std::vector<double> velocity_sum;  // over the 3 ranks' files of step 20
  for (int r = 0; r < 3; ++r) {
    const auto file = CheckpointFile::read(checkpoint_path(prefix, 20, r));
    for (const auto& [name, record] : file.records()) {
      if (name.rfind("dgc/velocity/", 0) != 0) continue;
      std::vector<float> v(record.data.size() / sizeof(float));
      file.get_floats(name, v);
      double sum = 0.0;
      for (const float x : v) sum += x;
      velocity_sum.push_back(sum);
    }
  }
  ASSERT_FALSE(velocity_sum.empty());
  double before = 0.0;
  for (const double s : velocity_sum) before += s;
  before /= 3.0;
  for (int r = 0; r < 3; ++r) {
    for (const int64_t s : checkpoint_steps(prefix, r)) {
      if (s > 20) fs::remove(checkpoint_path(prefix, s, r));
    }
  }

  options.checkpoint = prefix;
  options.checkpoint_keep = 0;
  options.resume_auto = true;
  std::vector<double> after(2, 0.0);
  std::vector<int64_t> start(2, -1);
  std::vector<int64_t> end(2, -1);
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Trainer trainer(comm, options, *task_);
    start[comm.rank()] = trainer.start_iteration();
    const Compressor* compressor = trainer.optimizer().compressor();
    for (size_t t = 0; t < compressor->num_tensors(); ++t) {
      for (const float x : compressor->velocity(t)) after[comm.rank()] += x;
    }
    const auto summary = trainer.run();
    end[comm.rank()] = trainer.optimizer().iteration();
    EXPECT_GT(metric_value(summary.evaluation, "test_accuracy"), 0.4) << "chance is 0.10";
  });
  // 2 x 16: 32 iterations per epoch; step 20 of 22 in epoch 1 -> floor(20 x 3 / 2) = 30.
  EXPECT_EQ(start[0], 30);
  EXPECT_EQ(start[1], 30);
  EXPECT_EQ(end[0], 64);
  EXPECT_NEAR((after[0] + after[1]) / 2.0, before, 1e-4 * (1.0 + std::abs(before)))
      << "the average velocity over the ranks is kept";
  EXPECT_EQ(checkpoint_steps(prefix, 0).back(), 64);
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
