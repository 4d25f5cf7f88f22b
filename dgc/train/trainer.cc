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

// The trainer's settings, then the task's.
std::string run_settings(const TrainOptions& o, const Task& task) {
  std::ostringstream out;
  out << "model=" << o.model << "\n"
      << "epochs=" << o.epochs << "\n"
      << "batch_size=" << o.batch_size << "\n"
      << "seed=" << o.seed << "\n"
      << task.settings(o);
  return out.str();
}

}  // namespace

std::string checkpoint_path(const std::string& prefix, int rank) {
  return prefix + ".rank" + std::to_string(rank);
}

Trainer::Trainer(comm::Communicator& comm, const TrainOptions& options, const Task& task)
    : comm_(comm), options_(options), task_(task) {
  DGC_CHECK_GE(options_.epochs, 1, "epochs");
  DGC_CHECK_GE(options_.batch_size, 1, "batch size");
  if (options_.threads > 0) at::set_num_threads(options_.threads);
  worker_ = task_.make_worker(options_, comm_.rank(), comm_.size());
  const int64_t iterations = worker_->iterations_per_epoch();
  DGC_CHECK_GE(iterations, 1, "iterations per epoch of task ", task_.name());
  options_.optimizer.iterations_per_epoch = iterations;
  DGC_CHECK_GE(options_.warmup_stages, 0, "warm-up stages");
  auto& density = options_.optimizer.density;
  if (options_.warmup_stages > 0 && density.iterations_per_stage == 0 &&
      density.warmup_epochs > 0) {
    const double warmup_iterations = density.warmup_epochs * static_cast<double>(iterations);
    density.iterations_per_stage = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(warmup_iterations / options_.warmup_stages)));
  }
  options_.optimizer.lr.total_epochs = options_.epochs;

  optimizer_ = std::make_unique<DistributedOptimizer>(comm_, worker_->model(), options_.optimizer,
                                                      run_settings(options_, task_));

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
    if (optimizer_->iteration() != start_epoch_ * iterations) {
      throw DataError(detail::concat("checkpoint ", file.path(), " is inconsistent: iteration ",
                                     optimizer_->iteration(), " after ", start_epoch_,
                                     " epochs of ", iterations, " iterations"));
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

std::vector<Metric> Trainer::evaluate() {
  return worker_->evaluate(comm_, options_.optimizer.timeout);
}

TrainSummary Trainer::run(const TrainCallbacks& callbacks) {
  const auto run_start = Clock::now();
  const int rank = comm_.rank();
  const int world = comm_.size();
  const int64_t iterations = worker_->iterations_per_epoch();
  auto& optimizer = *optimizer_;
  auto& model = worker_->model();

  const std::string unit = task_.item_unit();
  TrainSummary summary;
  summary.world_size = world;
  summary.parameters = parameter_count(model);
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

  model.train();
  int64_t steps_done = 0;
  const int64_t steps_total = (options_.epochs - start_epoch_) * iterations;
  for (int epoch = start_epoch_; epoch < options_.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    const ExchangeBytes bytes_before = optimizer.total_bytes();
    worker_->begin_epoch(epoch);
    double loss_sum = 0.0;
    int64_t items = 0;
    double lr = 0.0;
    double density = 0.0;
    double exchange_seconds = 0.0;
    for (int64_t it = 0; it < iterations; ++it) {
      model.zero_grad();
      const BatchLoss batch = worker_->train_batch(it);
      batch.loss.backward();
      items += batch.items;
      lr = optimizer.learning_rate();
      density = optimizer.density();
      optimizer.step();
      exchange_seconds += optimizer.last_timings().exchange;
      loss_sum += batch.loss.item<double>();
      ++steps_done;
      if (rank == 0 && callbacks.on_progress) {
        Progress p;
        p.epoch = epoch;
        p.epochs = options_.epochs;
        p.iteration = it + 1;
        p.iterations_per_epoch = iterations;
        p.loss = loss_sum / static_cast<double>(it + 1);
        const double epoch_seconds = seconds_since(epoch_start);
        p.items_per_second = static_cast<double>(items * world) / std::max(epoch_seconds, 1e-9);
        p.item_unit = unit;
        p.bytes_sent = optimizer.total_bytes().message;
        const double run_seconds = seconds_since(run_start);
        p.seconds_left = run_seconds / static_cast<double>(steps_done) *
                         static_cast<double>(steps_total - steps_done);
        callbacks.on_progress(p);
      }
    }

    const double train_seconds = seconds_since(epoch_start);
    // Every rank holds the same parameters; make the buffers (BatchNorm statistics) agree too.
    optimizer.synchronize_buffers();
    std::vector<float> loss_total = {static_cast<float>(loss_sum)};
    comm_.allreduce_sum(loss_total, options_.optimizer.timeout);
    auto evaluation = evaluate();

    EpochMetrics metrics;
    metrics.epoch = epoch + 1;
    metrics.train_loss = loss_total[0] / static_cast<double>(iterations * world);
    metrics.evaluation = evaluation;
    metrics.lr = lr;
    metrics.density = density;
    metrics.iterations = iterations;
    metrics.train_seconds = train_seconds;
    metrics.exchange_seconds = exchange_seconds;
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
    summary.evaluation = std::move(evaluation);
    if (rank == 0 && callbacks.on_epoch) callbacks.on_epoch(metrics);
  }
  if (summary.epochs.empty()) {
    summary.evaluation = evaluate();
  }
  summary.total = optimizer.total_bytes();
  summary.post_warmup = optimizer.post_warmup_bytes();
  summary.seconds = seconds_since(run_start);
  return summary;
}

}  // namespace dgc::train
