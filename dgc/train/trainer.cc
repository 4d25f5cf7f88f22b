#include "dgc/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/exchange_choice.h"
#include "dgc/train/models.h"
#include "dgc/train/optimizer.h"
#include "dgc/train/resume.h"
#include "dgc/train/trainer_internal.h"

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

using namespace trainer_detail;

Trainer::Trainer(comm::Communicator& comm, const TrainOptions& options, const Task& task)
    : comm_(comm), options_(options), task_(task) {
  DGC_CHECK_GE(options_.epochs, 1, "epochs");
  DGC_CHECK_GE(options_.batch_size, 1, "batch size");
  DGC_CHECK_GE(options_.checkpoint_every, 0, "checkpoint_every (steps)");
  DGC_CHECK_GE(options_.checkpoint_keep, 0, "checkpoint_keep");
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
  if (options_.lr_scaling != LrScaling::kNone) {
    options_.optimizer.lr.base = scaled_learning_rate(
        options_.optimizer.lr.base, options_.lr_scaling, options_.batch_size * comm_.size(),
        options_.lr_reference_batch, options_.lr_batch_limit);
  }

  // --exchange auto for a stated link: the cost model's choice, the same on every rank.
  if (!options_.exchange_link.empty() && options_.optimizer.exchange == ExchangeAlgorithm::kAuto &&
      options_.optimizer.compression == Compression::kDgc) {
    std::vector<NamedShape> shapes;
    for (const auto& p : worker_->model().named_parameters(/*recurse=*/true)) {
      shapes.emplace_back(p.key(), p.value().sizes().vec());
    }
    const ExchangeChoice choice =
        choose_exchange_for_link(shapes, comm_.size(), options_.optimizer.density.after_warmup,
                                 parse_link(options_.exchange_link));
    options_.optimizer.exchange = choice.algorithm;
    exchange_choice_ = choice.text;
  }

  // The residual statistics read the one compressor of an unbucketed step.
  if (options_.residual_stats) options_.optimizer.bucket_cap_mb = 0.0;
  optimizer_ = std::make_unique<DistributedOptimizer>(comm_, worker_->model(), options_.optimizer,
                                                      run_settings(options_, task_));
  if (options_.residual_stats && comm_.rank() == 0 && optimizer_->compressor() != nullptr) {
    residual_stats_ = std::make_unique<ResidualStats>(
        *optimizer_->compressor(), optimizer_->distributed_step().compressed_tensors());
  }

  // Checkpoints end in a barrier: every rank must write them after the same steps. (Not a
  // setting of the run: a resumed run may checkpoint at another rate.)
  const std::string checkpointing =
      options_.checkpoint.empty()
          ? "no checkpoints"
          : detail::concat("checkpoints every ", options_.checkpoint_every, " steps");
  const auto all = allgather_text(comm_, checkpointing, options_.optimizer.timeout);
  for (const auto& theirs : all) {
    if (theirs != checkpointing) {
      throw MismatchError("the ranks were started with different checkpoint flags (" +
                          per_rank_text(all, "") +
                          "): give every rank the same --checkpoint and --checkpoint-every");
    }
  }

  // --resume auto: fresh, the ordinary resume, or the set handed over to another world size.
  const auto resume_start = Clock::now();
  std::unique_ptr<CheckpointFile> rescaled;
  int rescaled_from = 0;  // the world size that wrote it
  if (options_.resume_auto) {
    DGC_CHECK(!options_.checkpoint.empty(), "--resume auto needs --checkpoint PATH");
    const auto timeout = options_.optimizer.timeout;
    const AutoResume found = choose_auto_resume(comm_, options_.checkpoint, timeout);
    options_.resume = found.kind != AutoResume::Kind::kFresh;
    options_.resume_step = found.step;
    if (found.kind == AutoResume::Kind::kNewWorld) {
      rescaled_from = found.stored_world;
      CheckpointFile fresh;
      optimizer_->save(fresh);
      rescaled = std::make_unique<CheckpointFile>(read_rescaled_checkpoint(
          comm_, options_.checkpoint, found, fresh, optimizer_->settings(), iterations, timeout,
          /*lr_follows_world_size=*/options_.lr_scaling != LrScaling::kNone));
    }
  }
  if (options_.resume) {
    DGC_CHECK(!options_.checkpoint.empty(), "--resume needs --checkpoint PATH");
    int64_t step = 0;
    auto file = rescaled ? std::move(*rescaled) : read_resume_checkpoint(&step);
    if (rescaled) step = read_int(file, "optimizer/iteration");
    optimizer_->load(file);
    const int64_t epochs_done = read_int(file, "train/epochs_done");
    optimizer_->check_agreement();
    const int64_t done = optimizer_->iteration();
    if (done != step) {
      throw DataError(detail::concat("checkpoint ", file.path(), " holds iteration ", done,
                                     ", not the step ", step,
                                     " its name says: was it renamed? Resume from the file of "
                                     "the step it holds"));
    }
    if (done > options_.epochs * iterations || epochs_done != done / iterations) {
      throw DataError(detail::concat("checkpoint ", file.path(), " is inconsistent: iteration ",
                                     done, " after ", epochs_done, " finished epochs of ",
                                     iterations, " iterations, in a run of ", options_.epochs,
                                     " epochs"));
    }
    start_iteration_ = done;
    start_epoch_ = static_cast<int>(done / iterations);
    resumed_from_ = file.path();
    if (rescaled) {
      resumed_from_ += detail::concat(" (written by ", rescaled_from, " workers; handed over to ",
                                      comm_.size(), ")");
    }
    if (done % iterations != 0) {
      // Inside an epoch: the epoch's sums so far (read now, so a malformed file stops the start).
      resume_progress_ = std::make_unique<EpochProgress>();
      resume_progress_->loss_sum = read_double(file, "train/epoch_loss_sum");
      resume_progress_->bytes_before = read_bytes(file, "train/epoch_bytes_start");
      resume_progress_->train_seconds = read_double(file, "train/epoch_train_seconds");
      resume_progress_->exchange_seconds = read_double(file, "train/epoch_exchange_seconds");
      if (file.has("train/epoch_skipped_steps")) {
        resume_progress_->skipped_steps = read_int(file, "train/epoch_skipped_steps");
      }
      resume_file_ = std::make_unique<CheckpointFile>(std::move(file));
    }
    resume_seconds_ = seconds_since(resume_start);
  }
}

Trainer::~Trainer() = default;

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
    info.lr = optimizer.options().lr.base;
    info.start_epoch = start_epoch_;
    info.start_iteration = start_iteration_;
    info.resumed_from = resumed_from_;
    info.resume_seconds = resume_seconds_;
    info.run_id = to_hex(optimizer.run_id());
    info.authenticated = optimizer.authenticated();
    info.buckets = static_cast<int64_t>(optimizer.bucketed_step().bucket_count());
    info.one_message_reason = optimizer.bucketed_step().plan().one_message_reason;
    info.exchange_choice = exchange_choice_;
    callbacks.on_start(info);
  }

  model.train();
  int64_t steps_done = 0;
  const int64_t steps_total = options_.epochs * iterations - start_iteration_;
  const bool checkpoints = !options_.checkpoint.empty();
  const int64_t every = options_.checkpoint_every;
  for (int epoch = start_epoch_; epoch < options_.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    worker_->begin_epoch(epoch);
    EpochProgress progress;
    progress.bytes_before = optimizer.total_bytes();
    int64_t first = 0;
    if (resume_file_ != nullptr) {
      // Resumed inside this epoch: the task's carried state and the epoch's sums so far.
      first = start_iteration_ - static_cast<int64_t>(epoch) * iterations;
      worker_->load_state(*resume_file_);
      progress = *resume_progress_;
      resume_file_.reset();
      resume_progress_.reset();
    }
    const double seconds_before = progress.train_seconds;
    double checkpoint_seconds = 0.0;  // mid-epoch checkpoints: not training time
    int64_t items = 0;
    double lr = 0.0;
    double density = 0.0;
    for (int64_t it = first; it < iterations; ++it) {
      model.zero_grad();
      const BatchLoss batch = worker_->train_batch(it);
      batch.loss.backward();
      items += batch.items;
      lr = optimizer.learning_rate();
      density = optimizer.density();
      const bool taken = optimizer.step();
      progress.exchange_seconds += optimizer.last_timings().exchange;
      progress.exchange_seconds_max =
          std::max(progress.exchange_seconds_max, optimizer.last_timings().exchange);
      if (taken) {
        progress.loss_sum += batch.loss.item<double>();
        if (residual_stats_) {
          const DistributedStep& step = optimizer.distributed_step();
          residual_stats_->record(optimizer.iteration() - 1, step.last_selections());
          record_selection_overlap(step, *residual_stats_);
        }
      } else {
        // Skipped on every rank: its loss (likely not finite) stays out of the epoch's mean.
        ++progress.skipped_steps;
        if (rank == 0 && callbacks.on_skipped_step) {
          SkippedStep skipped;
          skipped.iteration = optimizer.iteration() - 1;
          skipped.epoch = epoch + 1;
          skipped.bad_ranks = optimizer.last_bad_ranks();
          skipped.world_size = world;
          skipped.skipped_steps = optimizer.skipped_steps();
          callbacks.on_skipped_step(skipped);
        }
      }
      ++steps_done;
      if (checkpoints && every > 0 && optimizer.iteration() % every == 0 && it + 1 < iterations) {
        const auto checkpoint_start = Clock::now();
        progress.train_seconds = seconds_before + seconds_since(epoch_start) - checkpoint_seconds;
        save_checkpoint(epoch, &progress);
        checkpoint_seconds += seconds_since(checkpoint_start);
      }
      if (rank == 0 && callbacks.on_progress) {
        Progress p;
        p.epoch = epoch;
        p.epochs = options_.epochs;
        p.iteration = it + 1;
        p.iterations_per_epoch = iterations;
        p.loss = progress.loss_sum /
                 static_cast<double>(std::max<int64_t>(it + 1 - progress.skipped_steps, 1));
        const double epoch_seconds = seconds_since(epoch_start);
        p.items_per_second = static_cast<double>(items * world) / std::max(epoch_seconds, 1e-9);
        p.item_unit = unit;
        p.message_bytes = optimizer.total_bytes().message;
        const double run_seconds = seconds_since(run_start);
        p.seconds_left = run_seconds / static_cast<double>(steps_done) *
                         static_cast<double>(steps_total - steps_done);
        callbacks.on_progress(p);
      }
    }

    const double train_seconds = seconds_before + seconds_since(epoch_start) - checkpoint_seconds;
    // Every rank holds the same parameters; make the buffers (BatchNorm statistics) agree too.
    optimizer.synchronize_buffers();
    std::vector<float> loss_total = {static_cast<float>(progress.loss_sum)};
    comm_.allreduce_sum(loss_total, options_.optimizer.timeout);
    auto evaluation = evaluate();

    EpochMetrics metrics;
    metrics.epoch = epoch + 1;
    // Every rank skipped the same steps.
    const int64_t taken_steps = iterations - progress.skipped_steps;
    metrics.train_loss =
        taken_steps > 0 ? loss_total[0] / static_cast<double>(taken_steps * world) : 0.0;
    metrics.skipped_steps = progress.skipped_steps;
    metrics.evaluation = evaluation;
    metrics.lr = lr;
    metrics.density = density;
    metrics.iterations = iterations;
    metrics.resumed_at = first;
    metrics.train_seconds = train_seconds;
    metrics.exchange_seconds = progress.exchange_seconds;
    metrics.exchange_seconds_max = progress.exchange_seconds_max;
    const ExchangeBytes& after = optimizer.total_bytes();
    metrics.bytes = after;
    metrics.bytes -= progress.bytes_before;
    metrics.compression_ratio = metrics.bytes.message > 0
                                    ? static_cast<double>(metrics.bytes.dense_gradient) /
                                          static_cast<double>(metrics.bytes.message)
                                    : 0.0;
    if (residual_stats_) metrics.residual = residual_stats_->take(*optimizer.compressor());
    if (checkpoints) save_checkpoint(epoch + 1, nullptr);
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
  summary.skipped_steps = optimizer.skipped_steps();
  summary.seconds = seconds_since(run_start);
  return summary;
}

}  // namespace dgc::train
