#include "dgc/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/models.h"
#include "dgc/train/optimizer.h"
#include "dgc/train/resume.h"

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

// Every rank's `mine`, in rank order (collective).
std::vector<std::string> allgather_text(comm::Communicator& comm, const std::string& mine,
                                        comm::Timeout timeout) {
  const auto all = comm.allgatherv(
      std::span(reinterpret_cast<const uint8_t*>(mine.data()), mine.size()), timeout);
  std::vector<std::string> out;
  for (const auto& bytes : all) out.emplace_back(bytes.begin(), bytes.end());
  return out;
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::ostringstream text;
  for (size_t i = 0; i < steps.size(); ++i) text << (i == 0 ? "" : " ") << steps[i];
  return text.str();
}

std::vector<int64_t> parse_steps(const std::string& text) {
  std::istringstream in(text);
  std::vector<int64_t> steps;
  for (int64_t step = 0; in >> step;) steps.push_back(step);
  return steps;
}

bool contains(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

// "rank 0: step 120, rank 1: step 100"
std::string per_rank_text(const std::vector<std::string>& values, const std::string& what) {
  std::string text;
  for (size_t r = 0; r < values.size(); ++r) {
    text += detail::concat(r == 0 ? "" : ", ", "rank ", r, ": ", what, values[r]);
  }
  return text;
}

}  // namespace

struct Trainer::EpochProgress {
  double loss_sum = 0.0;       // this rank's batch losses so far in the epoch
  ExchangeBytes bytes_before;  // the run's byte counters when the epoch began
  double train_seconds = 0.0;  // the epoch's training steps so far
  double exchange_seconds = 0.0;
  int64_t skipped_steps = 0;  // skipped in the epoch so far (their losses are not in loss_sum)
};

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

  optimizer_ = std::make_unique<DistributedOptimizer>(comm_, worker_->model(), options_.optimizer,
                                                      run_settings(options_, task_));

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
          comm_, options_.checkpoint, found, fresh, optimizer_->settings(), iterations, timeout));
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

CheckpointFile Trainer::read_resume_checkpoint(int64_t* chosen) {
  const auto timeout = options_.optimizer.timeout;
  const int rank = comm_.rank();
  const int world = comm_.size();
  const std::string& prefix = options_.checkpoint;
  const std::string pattern = prefix + ".step<S>.rank<r>";

  // 1. Which steps every rank has files of.
  const auto listed = allgather_text(comm_, steps_text(checkpoint_steps(prefix, rank)), timeout);
  std::vector<std::vector<int64_t>> steps;
  for (const auto& text : listed) steps.push_back(parse_steps(text));
  std::vector<int64_t> common;
  for (const int64_t s : steps[0]) {
    bool everywhere = true;
    for (const auto& theirs : steps) everywhere = everywhere && contains(theirs, s);
    if (everywhere) common.push_back(s);
  }
  auto newest_common = [&](int64_t below) {
    for (auto it = common.rbegin(); it != common.rend(); ++it) {
      if (*it < below) {
        return detail::concat("the newest step every rank has is ", *it,
                              ": resume from it with --resume-step ", *it);
      }
    }
    return std::string(
        "no earlier step has a file of every rank: start a new run without "
        "--resume");
  };
  int64_t step = options_.resume_step;
  if (step >= 0) {
    std::string missing;
    for (int r = 0; r < world; ++r) {
      if (!contains(steps[r], step)) missing += detail::concat(missing.empty() ? "" : ", ", r);
    }
    if (!missing.empty()) {
      throw DataError(detail::concat("no checkpoint of step ", step, " for rank(s) ", missing, " (",
                                     pattern, "; steps found: ", per_rank_text(listed, ""), "); ",
                                     common.empty()
                                         ? std::string("no step has a file of every rank")
                                         : "steps every rank has: " + steps_text(common)));
    }
  } else {
    std::string missing;
    for (int r = 0; r < world; ++r) {
      if (steps[r].empty()) missing += detail::concat(missing.empty() ? "" : ", ", r);
    }
    if (!missing.empty()) {
      std::string present;
      for (int r = 0; r < world; ++r) {
        if (!steps[r].empty()) present += detail::concat(present.empty() ? "" : ", ", r);
      }
      throw DataError(
          "no checkpoint for rank(s) " + missing + " (files " + pattern + ")" +
          (present.empty()
               ? ": check --checkpoint, or start a new run without --resume"
               : "; rank(s) " + present +
                     " have one: was the run written by fewer workers? Resume with the same "
                     "number of workers"));
    }
    step = steps[0].back();
    bool same = true;
    for (const auto& theirs : steps) same = same && theirs.back() == step;
    if (!same) {
      std::vector<std::string> newest;
      for (const auto& theirs : steps) newest.push_back(std::to_string(theirs.back()));
      throw MismatchError("the ranks' newest checkpoints are from different steps (" +
                          per_rank_text(newest, "step ") +
                          "): the run stopped while writing them; " +
                          newest_common(std::numeric_limits<int64_t>::max()));
    }
  }

  // 2. This rank's file; every rank learns every rank's outcome, so that all refuse together.
  std::string error;
  std::unique_ptr<CheckpointFile> file;
  try {
    file =
        std::make_unique<CheckpointFile>(CheckpointFile::read(checkpoint_path(prefix, step, rank)));
  } catch (const DataError& e) {
    error = e.what();
  }
  const auto errors = allgather_text(comm_, error, timeout);
  std::string failed;
  for (int r = 0; r < world; ++r) {
    if (!errors[r].empty()) failed += detail::concat(failed.empty() ? "" : "; ", errors[r]);
  }
  if (failed.empty()) {
    *chosen = step;
    return std::move(*file);
  }

  // 3. The newest older step whose files every rank can read.
  std::vector<int64_t> readable;
  for (const int64_t s : common) {
    if (s >= step) continue;
    try {
      CheckpointFile::read(checkpoint_path(prefix, s, rank));
      readable.push_back(s);
    } catch (const DataError&) {
    }
  }
  const auto all_readable = allgather_text(comm_, steps_text(readable), timeout);
  int64_t previous = -1;
  for (const int64_t s : readable) {
    bool everywhere = true;
    for (const auto& theirs : all_readable)
      everywhere = everywhere && contains(parse_steps(theirs), s);
    if (everywhere) previous = std::max(previous, s);
  }
  std::string remedy;
  if (previous >= 0) {
    remedy =
        detail::concat("The newest older checkpoint every rank can read is step ", previous, " (",
                       checkpoint_path(prefix, previous, 0), " ..", world > 1 ? " .rank" : "",
                       world > 1 ? std::to_string(world - 1) : std::string(),
                       "): resume from it with "
                       "--resume-step ",
                       previous, " (its first checkpoint deletes the later steps' files)");
  } else {
    remedy = "No older checkpoint every rank can read: start a new run without --resume";
  }
  throw DataError(detail::concat("cannot resume from step ", step, ": ", failed, ". ", remedy));
}

Trainer::~Trainer() = default;

void Trainer::save_checkpoint(int epochs_done, const EpochProgress* epoch_progress) {
  CheckpointFile file;
  optimizer_->save(file);
  file.put_text("train/epochs_done", std::to_string(epochs_done));
  if (epoch_progress != nullptr) {
    file.put_text("train/epoch_loss_sum", double_text(epoch_progress->loss_sum));
    file.put_text("train/epoch_bytes_start", bytes_text(epoch_progress->bytes_before));
    file.put_text("train/epoch_train_seconds", double_text(epoch_progress->train_seconds));
    file.put_text("train/epoch_exchange_seconds", double_text(epoch_progress->exchange_seconds));
    file.put_text("train/epoch_skipped_steps", std::to_string(epoch_progress->skipped_steps));
    worker_->save_state(file);
  }
  const int64_t step = optimizer_->iteration();
  file.write(checkpoint_path(options_.checkpoint, step, comm_.rank()));
  // The barrier: every rank has written this step. An allgather of the step rather than
  // Communicator::barrier, because the ring collective's errors name the rank that stalled or died
  // (Gloo's barrier does not), and every rank checks that all wrote the same step.
  const std::string mine = std::to_string(step);
  const auto written = allgather_text(comm_, mine, options_.optimizer.timeout);
  for (const auto& theirs : written) {
    if (theirs != mine) {
      throw MismatchError("the ranks wrote checkpoints of different steps (" +
                          per_rank_text(written, "step ") + "): the ranks are out of step");
    }
  }
  // Every rank has written this step: older sets may go.
  remove_old_checkpoints(options_.checkpoint, comm_.rank(), step, options_.checkpoint_keep);
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
    info.start_iteration = start_iteration_;
    info.resumed_from = resumed_from_;
    info.resume_seconds = resume_seconds_;
    info.run_id = to_hex(optimizer.run_id());
    info.authenticated = optimizer.authenticated();
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
      if (taken) {
        progress.loss_sum += batch.loss.item<double>();
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
    const ExchangeBytes& after = optimizer.total_bytes();
    metrics.bytes = after;
    metrics.bytes -= progress.bytes_before;
    metrics.compression_ratio = metrics.bytes.message > 0
                                    ? static_cast<double>(metrics.bytes.dense_gradient) /
                                          static_cast<double>(metrics.bytes.message)
                                    : 0.0;
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
