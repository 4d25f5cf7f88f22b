// A data-parallel training run of any task (task.h: image classification, language modelling)
// with the distributed optimizer, per-epoch evaluation, per-rank checkpoints and resume. The
// trainer does not know which task runs: the task supplies data, model, loss and metrics.
//
// Checkpoints are per rank (each rank's DGC velocity and momentum differ) and named by the step
// after which they were written: rank r writes `<checkpoint>.step<S>.rank<r>` (checkpoint.h)
// atomically (temporary file, fsync, rename, directory fsync) after every epoch and, with
// checkpoint_every = S > 0, after every step whose run-wide count is a multiple of S; then all
// ranks meet (an allgather of the step written, which names a lost rank), and only then does each
// rank delete its files but the newest checkpoint_keep (so a complete older set exists while a
// newer one is being written). Each file holds the model's parameters and buffers, the optimizer's
// momenta, the compressor's momentum/velocity per tensor and its RNG state, the iteration, the
// number of finished epochs, the byte and skipped-step counters and the run's settings; a file
// written inside an epoch also holds the epoch's partial metrics (this rank's loss sum, the byte
// counters at the epoch's start, the training and exchange seconds so far, the steps skipped) and
// the task's carried state (TaskWorker::save_state: the lm task's LSTM state and dropout
// generator). The data order needs no stored state: a task's state per epoch is a function of
// (seed, rank, epoch) (task.h).
//
// --resume picks the newest step every rank has a file of (or resume_step), reads every rank's
// file, rejects a file of another model, world size or settings, checks that all ranks are at
// the same iteration, and continues with the next step, inside an epoch too; the result is bit
// for bit the run that was not interrupted. A newest checkpoint that cannot be read (truncated,
// corrupt) is refused on every rank with a message naming the newest older step every rank can
// read and how to resume from it; so are ranks whose newest checkpoints are from different steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/exchange/exchange.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/options.h"
#include "dgc/train/residual_stats.h"
#include "dgc/train/task.h"

namespace dgc::train {

class DistributedOptimizer;

struct TrainOptions {
  std::string model = "cnn";  // the task's model: image cnn / mlp / resnet20 (models.h), lm lstm
  int epochs = 4;
  int64_t batch_size = 32;  // per worker; the global batch is workers x batch_size
  uint64_t seed = 1;        // model initialisation, data order, compressor sampling
  // The optimizer; iterations_per_epoch and lr.total_epochs are filled in by the trainer.
  OptimizerOptions optimizer;
  // The density warm-up in `warmup_stages` equal stages over optimizer.density.warmup_epochs:
  // sets density.iterations_per_stage = ceil(warmup_epochs * iterations_per_epoch / stages), so
  // the paper's 4 exponential stages (0.25, 0.0625, 0.015625, 0.0039, then d) fit a warm-up of
  // any length (the paper: 4 stages in 4 epochs). 0, or iterations_per_stage already > 0: keep
  // density.iterations_per_stage as it is (0 = one stage per epoch).
  int warmup_stages = 4;
  // Intra-op threads of libtorch for this worker (at::set_num_threads). 0: leave as is.
  int threads = 0;
  // Per-rank checkpoint path prefix ("" = none): files "<checkpoint>.step<S>.rank<r>", written
  // after every epoch and, when checkpoint_every > 0, after every checkpoint_every-th step of the
  // run (counted from the first step of the run, resumes included) inside an epoch. A setting
  // every rank must share (it is in the run's settings).
  std::string checkpoint;
  int64_t checkpoint_every = 0;
  // Checkpoints kept per rank: the newest checkpoint_keep steps' files (0: all).
  int checkpoint_keep = 2;
  // Resume from the newest step every rank has a checkpoint of, or, with resume_step >= 0, from
  // that step.
  bool resume = false;
  int64_t resume_step = -1;
  // `--resume auto` (resume.h): start fresh when no rank has a checkpoint, else resume from the
  // newest complete set, at another world size too (the set's state handed over). Overrides
  // resume and resume_step.
  bool resume_auto = false;
  // Use only the first N training / test examples (0 = all): quick runs and tests. What an
  // example is belongs to the task (an image; a verse of the lm task, whose test_examples limits
  // the validation and the test verses).
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  int64_t eval_batch_size = 500;  // examples per evaluation batch (image task)
  // The learning-rate rule for the global batch (options.h, LrScaling): optimizer.lr.base is the
  // rate for a global batch of lr_reference_batch (required, > 0, unless kNone), and the run uses
  // scaled_learning_rate(base, lr_scaling, workers x batch_size, lr_reference_batch). kNone (the
  // default here; `dgc train` defaults to sqrt at 128 for the image task) uses it as it is.
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t lr_reference_batch = 0;
  // > 0: the rule stops at this global batch (larger ones get its rate; `dgc train` defaults to
  // 1,024 for the image task, the largest global batch at which the rule was seen to hold).
  int64_t lr_batch_limit = 0;
  // With optimizer.exchange kAuto and DGC: the link between the workers (exchange_choice.h,
  // parse_link: a platform name or "RATE_MBIT[:LATENCY_MS]"); auto then takes the exchange the
  // cost model of `dgc plan` predicts fastest. Empty: auto keeps the size rule (choose_algorithm).
  std::string exchange_link;
  // DGC: measure the residual on rank 0 every epoch (EpochMetrics::residual; residual_stats.h).
  bool residual_stats = false;
};

// Reported on rank 0 once, before the first step.
struct RunInfo {
  int world_size = 1;
  int64_t parameters = 0;
  int64_t compressed_tensors = 0;
  int64_t compressed_parameters = 0;
  int64_t dense_tensors = 0;
  int64_t iterations_per_epoch = 0;
  int64_t warmup_iterations = 0;
  int64_t warmup_stage_iterations = 0;  // 0: one stage per epoch
  double lr = 0.0;                      // the base learning rate of the run (after lr_scaling)
  int start_epoch = 0;                  // > 0 when resumed after the first epoch
  int64_t start_iteration = 0;          // the run's steps done before this call (> 0: resumed)
  std::string resumed_from;             // rank 0's checkpoint file when resumed, else ""
  double resume_seconds = 0.0;          // choosing, reading and loading the checkpoint (rank 0)
  std::string run_id;                   // the job's run id (hex), from the exchange handshake
  bool authenticated = false;           // exchange messages carry HMAC-SHA256 tags (job secret)
  int64_t buckets = 1;                  // gradient buckets exchanged during the backward pass
  std::string one_message_reason;       // why there is one message (empty: buckets or 1 bucket)
  std::string exchange_choice;  // with TrainOptions::exchange_link: what auto chose, and why
};

// Reported on rank 0 after every step.
struct Progress {
  int epoch = 0;  // 0-based
  int epochs = 0;
  int64_t iteration = 0;  // within the epoch, 1-based after the step
  int64_t iterations_per_epoch = 0;
  double loss = 0.0;              // mean of this rank's batch losses so far in the epoch
  double items_per_second = 0.0;  // examples or tokens (Task::item_unit), all ranks, this epoch
  std::string item_unit;          // "ex", "tokens"
  uint64_t message_bytes = 0;     // this worker's message bytes, whole run
  double seconds_left = 0.0;      // estimate for the rest of the run
};

struct EpochMetrics {
  int epoch = 0;                   // 1-based
  double train_loss = 0.0;         // mean over ranks and taken (not skipped) steps of batch losses
  std::vector<Metric> evaluation;  // the task's metrics after the epoch
  double lr = 0.0;                 // at the last step of the epoch
  double density = 0.0;            // at the last step of the epoch
  int64_t iterations = 0;          // steps in this epoch
  int64_t skipped_steps = 0;       // of them, skipped for a non-finite gradient (--on-nonfinite)
  // > 0: the run resumed inside this epoch from a checkpoint written after this many of its
  // steps. train_loss, lr, density and bytes are still the whole epoch's (the checkpoint carries
  // the partial sums); train_seconds and exchange_seconds are the time before the checkpoint plus
  // the time after the resume (what was lost in between is not counted); seconds counts from the
  // resume.
  int64_t resumed_at = 0;
  ExchangeBytes bytes;             // this worker, this epoch
  double compression_ratio = 0.0;  // bytes.dense_gradient / bytes.message
  double seconds = 0.0;            // training and evaluation of this epoch
  double train_seconds = 0.0;      // the training steps alone (forward, backward, optimizer)
  double exchange_seconds = 0.0;   // the optimizer's exchange (encode, collectives, decode)
  // The slowest single exchange of the epoch (a stall: a link outage, a slow peer); in an epoch
  // resumed from a checkpoint, of the steps after the resume.
  double exchange_seconds_max = 0.0;
  // TrainOptions::residual_stats with DGC, rank 0: where the residual stands at the epoch's end.
  std::optional<ResidualEpochStats> residual;
};

struct TrainSummary {
  int world_size = 1;
  int64_t parameters = 0;
  std::vector<EpochMetrics> epochs;  // the epochs run by this call
  std::vector<Metric> evaluation;    // the task's metrics after the last epoch
  ExchangeBytes total;               // this worker, the whole run (including before a resume)
  ExchangeBytes post_warmup;         // this worker, iterations after the density warm-up
  int64_t skipped_steps = 0;         // skipped for a non-finite gradient, the whole run
  double seconds = 0.0;              // wall time of this call
};

// A step every rank skipped for a non-finite gradient (OptimizerOptions::on_nonfinite kSkip).
struct SkippedStep {
  int64_t iteration = 0;  // the step's iteration (0-based, over the run)
  int epoch = 0;          // 1-based
  int bad_ranks = 0;      // ranks whose gradient was not finite
  int world_size = 1;
  int64_t skipped_steps = 0;  // skipped so far in the run, this one included
};

// Callbacks run on rank 0 only, on the training thread; they must not throw.
struct TrainCallbacks {
  std::function<void(const RunInfo&)> on_start;
  std::function<void(const Progress&)> on_progress;
  std::function<void(const EpochMetrics&)> on_epoch;
  std::function<void(const SkippedStep&)> on_skipped_step;
};

class Trainer {
 public:
  // Builds this rank's task worker (model, seeded; data shard), the optimizer (collective:
  // handshake, initial broadcast) and, with options.resume, loads this rank's checkpoint
  // (collective). `task` is shared read-only between worker threads and must outlive the trainer.
  Trainer(comm::Communicator& comm, const TrainOptions& options, const Task& task);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Collective. Trains the remaining epochs; throws dgc::NumericError on a non-finite gradient
  // (on every rank at the same step; the last checkpoint is intact).
  TrainSummary run(const TrainCallbacks& callbacks = {});

  // Collective: the task's metrics of the current model.
  std::vector<Metric> evaluate();

  // Where the run starts: the epoch (0-based) and the run's steps already done (0 unless resumed).
  int start_epoch() const { return start_epoch_; }
  int64_t start_iteration() const { return start_iteration_; }
  torch::nn::Module& model() { return worker_->model(); }
  DistributedOptimizer& optimizer() { return *optimizer_; }

 private:
  struct EpochProgress;
  // Collective. Writes this rank's checkpoint after the current step (epoch_progress: inside an
  // epoch; null at an epoch's end), then the barrier, then deletes old files (checkpoint_keep).
  void save_checkpoint(int epochs_done, const EpochProgress* epoch_progress);
  // Collective. Chooses the step to resume from (stored in *step) and reads this rank's file (see
  // the file comment).
  CheckpointFile read_resume_checkpoint(int64_t* step);

  comm::Communicator& comm_;
  TrainOptions options_;
  const Task& task_;
  std::unique_ptr<TaskWorker> worker_;
  std::unique_ptr<DistributedOptimizer> optimizer_;
  int start_epoch_ = 0;
  int64_t start_iteration_ = 0;
  std::string resumed_from_;
  double resume_seconds_ = 0.0;
  std::string exchange_choice_;  // RunInfo::exchange_choice
  // Resumed inside an epoch: the file (for the task's state) and the epoch's sums, until run()
  // has restored the epoch from them.
  std::unique_ptr<CheckpointFile> resume_file_;
  std::unique_ptr<EpochProgress> resume_progress_;
  std::unique_ptr<ResidualStats> residual_stats_;  // TrainOptions::residual_stats, rank 0
};

}  // namespace dgc::train
