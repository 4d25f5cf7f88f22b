// The distributed optimizer: data-parallel SGD for any torch::nn::Module, with Deep Gradient
// Compression (docs/algorithm.md) or dense (the baseline), over one dgc::Exchange.
//
// A libtorch adapter over DistributedStep (step.h), which holds the algorithm and its state,
// driven in gradient buckets (buckets.h, options.bucket_cap_mb): with more than one bucket an
// autograd hook on every parameter hands its gradient to the step as soon as the backward pass has
// accumulated it, and each bucket's compression and exchange run while the backward pass goes on;
// each bucket updates its weights when done; step() gives what no hook gave and waits. Per
// step it reads every parameter's .grad (undefined = zero), lets the DistributedStep turn the
// local gradients of all ranks into one direction per parameter (clipping, compression, the
// exchange, momentum, weight decay; see step.h), and applies w -= lr * direction at the scheduled
// learning rate. With Compression::kNone every tensor takes the dense path: plain synchronous
// momentum SGD, the same update as single-worker SGD on the concatenated batch.
//
// Collective: the constructor, step(), synchronize_buffers() and check_agreement() must be called
// by every rank in the same order. Thread-safety: one optimizer per worker thread; the model and
// communicator must not be used by another thread meanwhile. With buckets, every backward pass
// through the model must be followed by one step(). The model and communicator must
// outlive the optimizer.
//
// Pipelined (options.pipeline 1): step() waits for the previous step, takes its lookahead back
// and applies its update, copies this step's gradients and starts this step on a thread of its
// own, which owns the communicator and the step's state until the next step(), flush(),
// synchronize_buffers(), check_agreement() or the destructor waits for it. Once that thread has
// compressed, step() applies this rank's own selection to the weights as a prediction of the
// update still in flight (the lookahead: the next gradient is taken at the weights as they will
// about be, not one update behind) and returns; the lookahead is undone, exactly, before the
// real update is applied. Meanwhile only iteration(), learning_rate(), density(),
// total_bytes() and last_timings() may be read (they describe the steps started so far, the bytes
// and times of those finished); call flush() before anything else: evaluating, save(), other use
// of the communicator. Not with NonFinitePolicy::kSkip (a skipped step is known a step late); one
// message per step (no gradient buckets).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include "dgc/train/buckets.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/options.h"
#include "dgc/train/step.h"

namespace dgc::train {

class DistributedOptimizer {
 public:
  // Collects the model's named parameters (float32, contiguous, CPU), builds the layout
  // (make_layout with options.policy; all dense with kNone), runs the Exchange's handshake over
  // describe(options) plus `run_settings` (further "key=value" lines all ranks must share, e.g.
  // the model name), then overwrites every rank's parameters and buffers with rank 0's.
  DistributedOptimizer(comm::Communicator& comm, torch::nn::Module& model, OptimizerOptions options,
                       const std::string& run_settings = "");
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // The gradient of parameter i (named_parameters order) is final for this step: hands it to the
  // step, whose bucket may start. The autograd hooks call it; a replay of a backward pass may too.
  // Each parameter at most once per step.
  void gradient_ready(size_t i);

  // One synchronous step (see the file comment). When any rank's gradient is not finite: throws
  // dgc::NumericError (options.on_nonfinite kStop, or too many skips in a row), or, with kSkip,
  // applies nothing on every rank and returns false (the iteration advances; skipped_steps()
  // counts it). dgc::CommError / dgc::DecodeError from the exchange. True when the step was taken.
  bool step();
  // Pipelined: waits for the step in flight and applies its update (rethrows what it threw). A
  // no-op otherwise, or when nothing is in flight.
  void flush();

  // Overwrites every rank's module buffers (BatchNorm running statistics) with rank 0's, in one
  // broadcast. Call before evaluating or checkpointing so every rank holds the same model.
  void synchronize_buffers();

  // Throws dgc::MismatchError on every rank unless all ranks are at the same iteration.
  void check_agreement();

  int64_t iteration() const { return pipelined() ? started_ : step_.iteration(); }
  // Steps skipped for a non-finite gradient (NonFinitePolicy::kSkip), over the whole run
  // (checkpoints carry it), and the ranks that were bad at the last step.
  int64_t skipped_steps() const { return step_.skipped_steps(); }
  int last_bad_ranks() const { return step_.last_bad_ranks(); }
  // Learning rate and density the next step() uses.
  double learning_rate() const;
  double density() const;
  // Iterations before this one are warm-up (the density is above d there).
  int64_t warmup_iterations() const;
  // Density of the dense-path group the next step() uses (1 unless DensePath::kGrouped).
  double dense_path_density() const { return step_.dense_path_density(); }

  const std::vector<TensorSpec>& layout() const { return step_.layout(); }
  const OptimizerOptions& options() const { return step_.options(); }
  // The settings text sent through the handshake (describe(options) + run settings).
  const std::string& settings() const { return step_.settings(); }
  // Null with Compression::kNone, and with more than one bucket (each has its own). Its tensors:
  // see DistributedStep::compressor().
  const Compressor* compressor() const {
    return step_.bucket_count() == 1 ? step_.bucket(0).compressor() : nullptr;
  }
  // The step under this optimizer (its last selections, its layout): with more than one bucket,
  // the first bucket's only.
  const DistributedStep& distributed_step() const { return step_.bucket(0); }
  // The buckets and their steps.
  const BucketedStep& bucketed_step() const { return step_; }
  // kFloat16 / kBFloat16: this rank's rounding residual of the dense path; empty otherwise.
  // (The 16-bit dense path always travels in one message: bucket 0 is the whole model.)
  std::span<const float> dense_residual() const { return step_.bucket(0).dense_residual(); }

  // Bytes of the last step, of all steps so far (carried over by checkpoints) and of the steps
  // after warm-up only.
  const ExchangeBytes& last_bytes() const { return step_.last_bytes(); }
  const RunId& run_id() const { return step_.run_id(); }
  bool authenticated() const { return step_.authenticated(); }
  const ExchangeBytes& total_bytes() const {
    return pipelined() ? finished_bytes_ : step_.total_bytes();
  }
  const ExchangeBytes& post_warmup_bytes() const { return step_.post_warmup_bytes(); }
  // The parts of the last step() (zeros before the first).
  const StepTimings& last_timings() const { return timings_; }
  // The seconds the last step() waited for buckets still in flight when it was called.
  double last_wait_seconds() const { return step_.last_wait_seconds(); }

  // Adds this rank's parameters, buffers, momenta, DGC velocity/momentum, compressor RNG, the
  // iteration, the byte counters and the skipped-step counters to `file` (records "model/...",
  // "optimizer/...", "dgc/...").
  void save(CheckpointFile& file) const;
  // Restores what save() wrote. Throws dgc::DataError naming the file when a record is missing or
  // has the wrong size (a checkpoint of a different model).
  void load(const CheckpointFile& file);

 private:
  struct Param {
    std::string name;
    torch::Tensor tensor;  // index in params_ == index in layout()
  };
  static std::vector<Param> collect_parameters(torch::nn::Module& model);
  void update_weight(size_t i, float lr);  // w -= lr * direction of parameter i
  bool pipelined() const { return step_.options().pipeline != 0; }
  bool pipelined_step();
  // Pipelined, on the step's thread: the step's selections are final (`selected`), or the step
  // ended without them; step() stops waiting either way (the first call counts).
  void release_lookahead(bool selected);
  // Each weight the lookahead changed back to its value before, exactly.
  void undo_lookahead();
  static std::vector<std::pair<std::string, std::vector<int64_t>>> named_shapes(
      const std::vector<Param>& params);

  comm::Communicator& comm_;
  torch::nn::Module& model_;
  std::vector<Param> params_;
  BucketedStep step_;
  std::vector<std::vector<float>> directions_;  // per parameter, with buckets only
  // This step's gradients handed to the step (kept alive until it ends), and which.
  std::vector<torch::Tensor> grads_;
  std::vector<uint8_t> given_;
  // With buckets: every parameter's gradient accumulator and the key of the hook on it.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  StepTimings timings_;
  // Pipelined: the step in flight, its gradients (copies) and iteration; the steps started so far
  // and the bytes of those finished.
  std::future<bool> in_flight_;
  std::vector<std::vector<float>> pipeline_grads_;
  // The weights the step in flight reads (weight decay, the exact dense path), copied before the
  // lookahead changes the parameters; empty when the step reads no weights.
  std::vector<std::vector<float>> pipeline_weights_;
  // The lookahead: the step's selections are ready (set once per step), whether they came, and
  // each weight it changed with its value before.
  std::promise<void> selected_;
  bool selected_released_ = false;
  bool selected_ready_ = false;
  struct Saved {
    size_t tensor;
    size_t element;
    float value;
  };
  std::vector<Saved> lookahead_;
  int64_t in_flight_iteration_ = 0;
  int64_t started_ = 0;
  ExchangeBytes finished_bytes_;
};

}  // namespace dgc::train
