// The distributed optimizer: data-parallel SGD for any torch::nn::Module, with Deep Gradient
// Compression (DGC.md) or dense (the baseline), over one dgc::Exchange.
//
// Per step, on every rank:
//   1. read the local gradients (.grad of every parameter; undefined = zero) and check that they
//      are finite, before any state is touched;
//   2. DGC: clip locally (local_clip_limit); dense-path tensors are copied into one flat
//      buffer; then the Compressor's step per compressed tensor (momentum correction, selection
//      at the scheduled density, masking). The dense path by options.dense_path: kGrouped steps
//      the flat buffer as one more compressed tensor at the dense-path density; kFloat16 /
//      kBFloat16 round it with error feedback (the residual stays on this rank); kExact leaves it;
//   3. the Exchange (options.exchange: allgather, direct or sparse-allreduce) of the compressed
//      messages (sum / N into `update`) and one average of the dense buffer (none with kGrouped;
//      16-bit values with kFloat16 / kBFloat16), with this
//      rank's "gradient ok" flag in the message header; what this rank selected but the exchange
//      did not apply (sparse-allreduce) goes back into its velocity
//      (Compressor::return_to_velocity);
//   4. if any rank flagged a non-finite gradient: every rank restores the compressor state it had
//      before the step and throws dgc::NumericError (weights, momenta, iteration: all unchanged);
//   5. update at the scheduled learning rate lr:
//        compressed tensor, and with kGrouped every dense-path tensor (its slice of the group):
//                           b = m*b + wd*w (Nesterov: b = m*b + wd*w, d_wd = wd*w + m*b)
//                           w -= lr * (d_wd + update)     (momentum is already inside update)
//        dense tensor:      g = avg + wd*w; u = m*u + g;  w -= lr * u  (Nesterov: lr*(g + m*u))
// With Compression::kNone every tensor takes the dense path: plain synchronous momentum SGD, the
// same update as single-worker SGD on the concatenated batch.
//
// Collective: the constructor, step(), synchronize_buffers() and check_agreement() must be called
// by every rank in the same order. Thread-safety: one optimizer per worker thread; the model and
// communicator must not be used by another thread meanwhile. The model and communicator must
// outlive the optimizer.
#pragma once

#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "dgc/core/compressor.h"
#include "dgc/exchange/exchange.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/options.h"

namespace dgc::train {

// Wall time of the parts of one step() on this rank, seconds (for benchmarks).
struct StepTimings {
  double compress = 0.0;  // gradients read and checked, clipping, the compressor, the dense buffer
  double exchange = 0.0;  // Exchange::run: encode, collectives, decode
  double update = 0.0;    // the weight update
};

class DistributedOptimizer {
 public:
  // Collects the model's named parameters (float32, contiguous, CPU), builds the layout
  // (make_layout with options.policy; all dense with kNone; with kGrouped the exchange's layout
  // holds the compressed tensors and then the dense-path group), runs the Exchange's handshake over
  // describe(options) plus `run_settings` (further "key=value" lines all ranks must share, e.g.
  // the model name), then overwrites every rank's parameters and buffers with rank 0's.
  DistributedOptimizer(comm::Communicator& comm, torch::nn::Module& model, OptimizerOptions options,
                       const std::string& run_settings = "");

  // One synchronous step (see the file comment). Throws dgc::NumericError when any rank's
  // gradient is not finite, dgc::CommError / dgc::DecodeError from the exchange.
  void step();

  // Overwrites every rank's module buffers (BatchNorm running statistics) with rank 0's, in one
  // broadcast. Call before evaluating or checkpointing so every rank holds the same model.
  void synchronize_buffers();

  // Throws dgc::MismatchError on every rank unless all ranks are at the same iteration.
  void check_agreement();

  int64_t iteration() const { return iteration_; }
  // Learning rate and density the next step() uses.
  double learning_rate() const;
  double density() const;
  // Density of the dense-path group the next step() uses (kGrouped; its own d, same warm-up).
  double dense_path_density() const;
  // Iterations before this one are warm-up (the density is above d there).
  int64_t warmup_iterations() const;

  // The model's tensors with the path the policy gave them (all dense with kNone).
  const std::vector<TensorSpec>& layout() const { return layout_; }
  const OptimizerOptions& options() const { return options_; }
  // The settings text sent through the handshake (describe(options) + run settings).
  const std::string& settings() const { return settings_; }
  // Null with Compression::kNone. Its tensors: the compressed tensors in layout order, then,
  // with DensePath::kGrouped, the dense-path group (the dense-path tensors concatenated in layout
  // order).
  const Compressor* compressor() const { return compressor_.get(); }
  // kFloat16 / kBFloat16: this rank's rounding residual over the dense-path tensors concatenated
  // in layout order (what rounding has held back so far); empty otherwise.
  std::span<const float> dense_residual() const { return dense_residual_; }

  // Bytes of the last step, of all steps so far (carried over by checkpoints) and of the steps
  // after warm-up only.
  const ExchangeBytes& last_bytes() const { return exchange_->last(); }
  const ExchangeBytes& total_bytes() const { return total_; }
  const ExchangeBytes& post_warmup_bytes() const { return post_warmup_; }
  // The parts of the last step() (zeros before the first).
  const StepTimings& last_timings() const { return timings_; }

  // Adds this rank's parameters, buffers, momenta, DGC velocity/momentum (of the dense-path
  // group too), the dense-path residual, compressor RNG, the iteration and the byte counters to
  // `file` (records "model/...", "optimizer/...", "dgc/...").
  void save(CheckpointFile& file) const;
  // Restores what save() wrote. Throws dgc::DataError naming the file when a record is missing or
  // has the wrong size (a checkpoint of a different model).
  void load(const CheckpointFile& file);

 private:
  struct Param {
    std::string name;
    torch::Tensor tensor;  // index in params_ == index in layout()
  };
  void restore_compressor();
  size_t group() const { return compressed_.size(); }  // the dense-path group's compressor index

  comm::Communicator& comm_;
  torch::nn::Module& model_;
  OptimizerOptions options_;
  std::string settings_;
  std::vector<Param> params_;
  std::vector<TensorSpec> layout_;
  std::vector<size_t> compressed_;  // indices into params_ of the compressed tensors
  std::vector<size_t> dense_;       // ... and of the dense-path tensors
  bool grouped_ = false;            // the dense path is the compressor's tensor group()
  // The dense path's wire type: fp32 (exact average, or nothing with grouped_), fp16 or bf16.
  ValueType dense_value_type_ = ValueType::kFloat32;
  std::unique_ptr<Exchange> exchange_;
  std::unique_ptr<Compressor> compressor_;
  int64_t iteration_ = 0;

  // Per compressor tensor (the compressed tensors, then the dense-path group if grouped_).
  std::vector<Selection> selections_;
  std::vector<Selection> unapplied_;  // what the exchange handed back, per compressed tensor
  std::vector<std::vector<float>> updates_;
  std::vector<std::vector<float>> decay_momentum_;  // weight-decay momentum b
  // Per dense tensor: ordinary momentum u (not with grouped_), and its offset in the flat buffer.
  std::vector<std::vector<float>> dense_momentum_;
  std::vector<size_t> dense_offsets_;
  std::vector<float> dense_flat_;
  // Copy of the compressor state taken before each step, restored on a NumericError.
  std::vector<std::vector<float>> saved_momentum_;
  std::vector<std::vector<float>> saved_velocity_;
  std::mt19937_64 saved_rng_;
  // kFloat16 / kBFloat16: the rounding residual of the flat buffer, and its copy for a bad step.
  std::vector<float> dense_residual_;
  std::vector<float> saved_residual_;

  ExchangeBytes total_;
  ExchangeBytes post_warmup_;
  StepTimings timings_;
};

}  // namespace dgc::train
