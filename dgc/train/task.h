// The seam between the shared training machinery and what one task brings.
//
// A task (image classification, language modelling, ...) supplies its data set, sharded per rank,
// its model, its loss and its evaluation metrics. The Trainer, the DistributedOptimizer,
// checkpoints, progress, the summary and the metrics file are shared and never ask which task
// runs. Adding a task: one file pair in dgc/train/tasks/ implementing Task and TaskWorker, and
// one line where the command line registers the tasks (dgc/cli/train_tasks.cc), with the
// task's defaults (TaskDefaults).
//
// Threading: one Task object per process, shared read-only by the worker threads (make_worker
// is const and thread-safe); one TaskWorker per rank, used by that rank's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "dgc/comm/communicator.h"
#include "dgc/train/options.h"

namespace dgc::train {

struct TrainOptions;
class CheckpointFile;

// One evaluation result: `name` is its key in the metrics file ("test_accuracy"), `text` how a
// person reads it ("test accuracy 91.20%").
struct Metric {
  std::string name;
  double value = 0.0;
  std::string text;
};

// The value of the metric called `name`; throws dgc::InvalidArgument when there is none.
double metric_value(const std::vector<Metric>& metrics, const std::string& name);

// printf-style text of one number, for Metric::text: format_number("%.2f%%", 91.2).
std::string format_number(const char* pattern, double value);

// How many of `available` examples a run uses: all of them when `limit` <= 0 (the options'
// "0 = all"), else at most `limit`.
int64_t used_count(int64_t available, int64_t limit);

// The settings whose default depends on the task. `dgc train` applies the task's to every one of
// these settings its command line does not give, and its --help shows them per task (one table);
// every other setting has the defaults of TrainOptions and OptimizerOptions for every task.
// shared_task_defaults() are those shared defaults; a task starts from them and changes what it
// needs (image_task_defaults(), lm_task_defaults(), speech_task_defaults()).
struct TaskDefaults {
  std::string model;          // TrainOptions::model
  int epochs = 0;             // TrainOptions::epochs
  int64_t batch_size = 0;     // TrainOptions::batch_size
  double lr = 0.0;            // OptimizerOptions::lr.base
  double weight_decay = 0.0;  // OptimizerOptions::weight_decay
  double clip_norm = 0.0;     // OptimizerOptions::clip_norm
  bool masking = false;       // OptimizerOptions::compressor.momentum.masking
  // OptimizerOptions::selection_scope of a DGC run (a dense run selects nothing).
  SelectionScope selection_scope = SelectionScope::kTensor;
  // TrainOptions::lr_scaling and lr_reference_batch: how the rate follows the global batch.
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t lr_reference_batch = 0;
  int64_t lr_batch_limit = 0;  // TrainOptions::lr_batch_limit
};

// The defaults of TrainOptions{} and its OptimizerOptions, as TaskDefaults.
TaskDefaults shared_task_defaults();

// The loss of one training batch on this rank.
struct BatchLoss {
  torch::Tensor loss;  // scalar: mean over the batch's items; backward() is called on it
  int64_t items = 0;   // examples or tokens in the batch (for the progress rate)
};

// The per-rank part of a task: the model (initialised from the run's seed, the same on every
// rank) and this rank's shard of the data.
class TaskWorker {
 public:
  virtual ~TaskWorker() = default;

  virtual torch::nn::Module& model() = 0;
  // The same on every rank; >= 1 (the task's constructor or make_worker throws otherwise).
  virtual int64_t iterations_per_epoch() const = 0;
  // Called before the first iteration of every epoch (0-based), also the first epoch after a
  // resume: a task whose state per epoch is a function of (seed, rank, epoch) resumes bit for bit.
  virtual void begin_epoch(int epoch) = 0;
  // The forward pass of iteration `iteration` (0-based, < iterations_per_epoch()) of the current
  // epoch, in training mode.
  virtual BatchLoss train_batch(int64_t iteration) = 0;
  // What train_batch carries from one iteration to the next inside an epoch beyond what
  // begin_epoch sets up (the lm task: the LSTM state of truncated BPTT and the dropout
  // generator), as records named "task/..." of this rank's checkpoint. save_state is called
  // after a step in the middle of an epoch; load_state after begin_epoch(epoch) when a run
  // resumes in the middle of that epoch, and must then make the following train_batch calls
  // those of the run that was not interrupted. Throws dgc::DataError naming the file when a
  // record is missing or does not fit. A task whose batches depend on (seed, rank, epoch,
  // iteration) alone (the image task) keeps the defaults, which store nothing.
  virtual void save_state(CheckpointFile& file) const { (void)file; }
  virtual void load_state(const CheckpointFile& file) { (void)file; }
  // Collective: evaluates the current model (in evaluation mode, back to training mode after);
  // every rank returns the same metrics, in display order.
  virtual std::vector<Metric> evaluate(comm::Communicator& comm, comm::Timeout timeout) = 0;
};

class Task {
 public:
  virtual ~Task() = default;

  virtual std::string name() const = 0;
  // What one item of BatchLoss::items is, for rates in the progress display: "ex", "tokens".
  virtual std::string item_unit() const = 0;
  // The metric the run's summary leads with ("test_accuracy", "test_perplexity").
  virtual std::string headline() const = 0;
  // "key=value" lines every rank must share and checkpoints record, after the trainer's own.
  virtual std::string settings(const TrainOptions& options) const = 0;
  // Builds rank `rank`'s worker. Thread-safe. Throws dgc::InvalidArgument when the options do
  // not fit the task (an unknown model, too little data for world_size x batch size).
  virtual std::unique_ptr<TaskWorker> make_worker(const TrainOptions& options, int rank,
                                                  int world_size) const = 0;
};

}  // namespace dgc::train
