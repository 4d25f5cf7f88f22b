#include "dgc/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/models.h"
#include "dgc/train/optimizer.h"

namespace dgc::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t used_count(int64_t available, int64_t limit) {
  return limit > 0 ? std::min(available, limit) : available;
}

// Normalised images [n, 1, rows, cols] and int64 labels [n] of the examples `indices`.
std::pair<torch::Tensor, torch::Tensor> make_batch(const ImageSet& set,
                                                   std::span<const int64_t> indices) {
  const auto n = static_cast<int64_t>(indices.size());
  const int64_t size = set.image_size();
  auto images = torch::empty({n, 1, set.rows, set.cols}, torch::kFloat32);
  auto labels = torch::empty({n}, torch::kInt64);
  float* x = images.data_ptr<float>();
  int64_t* y = labels.data_ptr<int64_t>();
  constexpr float kScale = 1.0f / (255.0f * kPixelStd);
  constexpr float kShift = kPixelMean / kPixelStd;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* pixels = set.pixels.data() + indices[static_cast<size_t>(i)] * size;
    for (int64_t p = 0; p < size; ++p) x[i * size + p] = pixels[p] * kScale - kShift;
    y[i] = set.labels[static_cast<size_t>(indices[static_cast<size_t>(i)])];
  }
  return {images, labels};
}

std::string run_settings(const TrainOptions& o, int64_t train_count, int64_t test_count) {
  std::ostringstream out;
  out << "model=" << o.model << "\n"
      << "epochs=" << o.epochs << "\n"
      << "batch_size=" << o.batch_size << "\n"
      << "seed=" << o.seed << "\n"
      << "train_examples=" << train_count << "\n"
      << "test_examples=" << test_count << "\n";
  return out.str();
}

}  // namespace

std::string checkpoint_path(const std::string& prefix, int rank) {
  return prefix + ".rank" + std::to_string(rank);
}

Trainer::Trainer(comm::Communicator& comm, const TrainOptions& options, const ImageSet& train_set,
                 const ImageSet& test_set)
    : comm_(comm), options_(options), train_set_(train_set), test_set_(test_set) {
  DGC_CHECK_GE(options_.epochs, 1, "epochs");
  DGC_CHECK_GE(options_.batch_size, 1, "batch size");
  DGC_CHECK_GE(options_.eval_batch_size, 1, "evaluation batch size");
  if (options_.threads > 0) at::set_num_threads(options_.threads);
  const int64_t train_count = used_count(train_set_.count, options_.train_examples);
  const int64_t test_count = used_count(test_set_.count, options_.test_examples);
  const EpochPlan plan{train_count, comm_.size(), options_.batch_size};
  if (plan.iterations() < 1) {
    throw InvalidArgument(detail::concat("too few training examples (", train_count, ") for ",
                                         comm_.size(), " workers of batch size ",
                                         options_.batch_size));
  }
  DGC_CHECK_GE(test_count, 1, "test examples");
  options_.optimizer.iterations_per_epoch = plan.iterations();
  DGC_CHECK_GE(options_.warmup_stages, 0, "warm-up stages");
  auto& density = options_.optimizer.density;
  if (options_.warmup_stages > 0 && density.iterations_per_stage == 0 &&
      density.warmup_epochs > 0) {
    const double warmup_iterations = density.warmup_epochs * static_cast<double>(plan.iterations());
    density.iterations_per_stage = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(warmup_iterations / options_.warmup_stages)));
  }
  options_.optimizer.lr.total_epochs = options_.epochs;

  model_ = make_model(options_.model, options_.seed);
  optimizer_ = std::make_unique<DistributedOptimizer>(
      comm_, *model_, options_.optimizer, run_settings(options_, train_count, test_count));

  if (options_.resume) {
    DGC_CHECK(!options_.checkpoint.empty(), "--resume needs --checkpoint PATH");
    const auto file = CheckpointFile::read(checkpoint_path(options_.checkpoint, comm_.rank()));
    optimizer_->load(file);
    const std::string epochs = file.text("train/epochs_done");
    try {
      start_epoch_ = std::stoi(epochs);
    } catch (const std::exception&) {
      throw DataError("checkpoint " + file.path() + ": record 'train/epochs_done' is malformed");
    }
    if (start_epoch_ < 0 || start_epoch_ > options_.epochs) {
      throw DataError(detail::concat("checkpoint ", file.path(), " is after epoch ", start_epoch_,
                                     " of a run of ", options_.epochs, " epochs"));
    }
    optimizer_->check_agreement();
    if (optimizer_->iteration() != start_epoch_ * plan.iterations()) {
      throw DataError(detail::concat("checkpoint ", file.path(), " is inconsistent: iteration ",
                                     optimizer_->iteration(), " after ", start_epoch_,
                                     " epochs of ", plan.iterations(), " iterations"));
    }
  }
}

Trainer::~Trainer() = default;

void Trainer::save_checkpoint(int epochs_done) {
  CheckpointFile file;
  optimizer_->save(file);
  file.put_text("train/epochs_done", std::to_string(epochs_done));
  file.write(checkpoint_path(options_.checkpoint, comm_.rank()));
  comm_.barrier(options_.optimizer.timeout);
}

std::pair<double, double> Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  const int64_t count = used_count(test_set_.count, options_.test_examples);
  const int world = comm_.size();
  // This rank's share: examples rank, rank + N, ...
  std::vector<int64_t> mine;
  for (int64_t i = comm_.rank(); i < count; i += world) mine.push_back(i);
  double correct = 0.0;
  double loss_sum = 0.0;
  for (size_t begin = 0; begin < mine.size();
       begin += static_cast<size_t>(options_.eval_batch_size)) {
    const size_t end = std::min(mine.size(), begin + static_cast<size_t>(options_.eval_batch_size));
    auto [images, labels] = make_batch(test_set_, std::span(mine).subspan(begin, end - begin));
    const auto logits = model_->forward(images);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += logits.argmax(1).eq(labels).sum().item<double>();
  }
  model_->train();
  std::vector<float> sums = {static_cast<float>(correct), static_cast<float>(loss_sum)};
  comm_.allreduce_sum(sums, options_.optimizer.timeout);
  return {sums[0] / static_cast<double>(count), sums[1] / static_cast<double>(count)};
}

TrainSummary Trainer::run(const TrainCallbacks& callbacks) {
  const auto run_start = Clock::now();
  const int rank = comm_.rank();
  const int world = comm_.size();
  const int64_t train_count = used_count(train_set_.count, options_.train_examples);
  const EpochPlan plan{train_count, world, options_.batch_size};
  const int64_t iterations = plan.iterations();
  auto& optimizer = *optimizer_;

  TrainSummary summary;
  summary.world_size = world;
  summary.parameters = parameter_count(*model_);
  if (rank == 0 && callbacks.on_start) {
    RunInfo info;
    info.world_size = world;
    info.parameters = summary.parameters;
    for (const auto& spec : optimizer.layout()) {
      if (spec.path == TensorPath::kCompressed) {
        ++info.compressed_tensors;
        info.compressed_parameters += spec.numel();
      } else {
        ++info.dense_tensors;
      }
    }
    info.iterations_per_epoch = iterations;
    info.warmup_iterations = optimizer.warmup_iterations();
    info.warmup_stage_iterations = optimizer.options().density.iterations_per_stage;
    info.start_epoch = start_epoch_;
    callbacks.on_start(info);
  }

  model_->train();
  int64_t steps_done = 0;
  const int64_t steps_total = (options_.epochs - start_epoch_) * iterations;
  for (int epoch = start_epoch_; epoch < options_.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    const ExchangeBytes bytes_before = optimizer.total_bytes();
    const auto order = epoch_permutation(train_count, options_.seed, epoch);
    double loss_sum = 0.0;
    double lr = 0.0;
    double density = 0.0;
    for (int64_t it = 0; it < iterations; ++it) {
      const auto [begin, end] = plan.range(rank, it);
      auto [images, labels] = make_batch(
          train_set_,
          std::span(order).subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
      model_->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model_->forward(images), labels);
      loss.backward();
      lr = optimizer.learning_rate();
      density = optimizer.density();
      optimizer.step();
      loss_sum += loss.item<double>();
      ++steps_done;
      if (rank == 0 && callbacks.on_progress) {
        Progress p;
        p.epoch = epoch;
        p.epochs = options_.epochs;
        p.iteration = it + 1;
        p.iterations_per_epoch = iterations;
        p.loss = loss_sum / static_cast<double>(it + 1);
        const double epoch_seconds = seconds_since(epoch_start);
        p.examples_per_second = static_cast<double>((it + 1) * world * options_.batch_size) /
                                std::max(epoch_seconds, 1e-9);
        p.bytes_sent = optimizer.total_bytes().message;
        const double run_seconds = seconds_since(run_start);
        p.seconds_left = run_seconds / static_cast<double>(steps_done) *
                         static_cast<double>(steps_total - steps_done);
        callbacks.on_progress(p);
      }
    }

    // Every rank holds the same parameters; make the buffers (BatchNorm statistics) agree too.
    optimizer.synchronize_buffers();
    std::vector<float> loss_total = {static_cast<float>(loss_sum)};
    comm_.allreduce_sum(loss_total, options_.optimizer.timeout);
    const auto [accuracy, test_loss] = evaluate();

    EpochMetrics metrics;
    metrics.epoch = epoch + 1;
    metrics.train_loss = loss_total[0] / static_cast<double>(iterations * world);
    metrics.test_loss = test_loss;
    metrics.test_accuracy = accuracy;
    metrics.lr = lr;
    metrics.density = density;
    metrics.iterations = iterations;
    const ExchangeBytes& after = optimizer.total_bytes();
    metrics.bytes = after;
    metrics.bytes -= bytes_before;
    metrics.compression_ratio = metrics.bytes.message > 0
                                    ? static_cast<double>(metrics.bytes.dense_gradient) /
                                          static_cast<double>(metrics.bytes.message)
                                    : 0.0;
    if (!options_.checkpoint.empty()) save_checkpoint(epoch + 1);
    metrics.seconds = seconds_since(epoch_start);
    summary.epochs.push_back(metrics);
    summary.test_accuracy = accuracy;
    if (rank == 0 && callbacks.on_epoch) callbacks.on_epoch(metrics);
  }
  if (summary.epochs.empty()) {
    summary.test_accuracy = evaluate().first;
  }
  summary.total = optimizer.total_bytes();
  summary.post_warmup = optimizer.post_warmup_bytes();
  summary.seconds = seconds_since(run_start);
  return summary;
}

}  // namespace dgc::train
