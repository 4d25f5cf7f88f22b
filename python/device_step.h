// The DDP hook's step with the gradients, the state and the directions on the gradients' device
// (a GPU; the CPU in the tests): dgc::train::DistributedStep's phases (dgc/train/step.h, same
// numbers below), with the DeviceCompressor in place of the core's Compressor.
//
//   1. the local gradient checked for NaN/Inf (one sum of squares on the device);
//   2. local clipping (coefficient as the core's clip_coefficient), the dense-path tensors
//      concatenated on the device, the DeviceCompressor's staged step per compressed tensor (and
//      for the dense-path group with dense_path "grouped");
//   3. the same dgc::Exchange as DistributedStep (same handshake and settings, same layout, same
//      wire format): only the selections (indices and values) come to the host, are encoded
//      there and travel over the process group; with NCCL the messages travel in CUDA buffers.
//      The exchange decodes into host buffers, and only the positions it wrote
//      (Exchange::last_written) go back to the device, where they are scattered into the update;
//      with dense_path "exact" the dense-path tensors (biases, small tensors) are averaged by the
//      exchange's dense path on the host;
//   4. a bad gradient on any rank: staged state discarded on every rank, stop or skip;
//   5. the directions on the device, with the formulas of DistributedStep.
//
// Supported settings: those of DistributedStep except compression "none", selection_scope
// "global", dense_path "fp16"/"bf16", exchange "sparse-allreduce" and lr_in_velocity, which
// throw dgc::InvalidArgument naming the setting (the core path, on the CPU, has them all).
// On CPU tensors with clip_norm 0 the directions equal DistributedStep's bit for bit (tested).
//
// Collective: the constructor and run() on every rank in the same order, as DistributedStep.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dgc/exchange/exchange.h"
#include "dgc/train/options.h"
#include "python/device_compressor.h"

namespace dgc::python {

class DeviceStep {
 public:
  DeviceStep(comm::Communicator& comm,
             const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
             train::OptimizerOptions options, const std::string& run_settings,
             torch::Device device);

  // One step. grads[i] and weights[i]: tensor i of the layout, float32 on the device. The
  // directions are written into grads. Returns false when every rank skipped the step (the
  // directions are then zero). Errors as DistributedStep::run.
  bool run(const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& weights);

  int64_t iteration() const { return iteration_; }
  void set_iteration(int64_t iteration) { iteration_ = iteration; }
  double density() const;
  double dense_path_density() const;
  int64_t warmup_iterations() const;
  const std::vector<TensorSpec>& layout() const { return layout_; }
  const std::string& settings() const { return settings_; }
  comm::Communicator& communicator() { return comm_; }
  torch::Device device() const { return device_; }

  int64_t skipped_steps() const { return skips_.total; }
  int64_t consecutive_skips() const { return skips_.consecutive; }
  void set_skipped_steps(int64_t total, int64_t consecutive) {
    skips_.total = total;
    skips_.consecutive = consecutive;
  }
  int last_bad_ranks() const { return skips_.last_bad_ranks; }

  const ExchangeBytes& last_bytes() const { return exchange_->last(); }
  const ExchangeBytes& total_bytes() const { return total_; }
  const ExchangeBytes& post_warmup_bytes() const { return post_warmup_; }
  void set_bytes(const ExchangeBytes& total, const ExchangeBytes& post_warmup) {
    total_ = total;
    post_warmup_ = post_warmup;
  }
  // compress, exchange, update (seconds), as StepTimings.
  const std::vector<double>& last_timings() const { return timings_; }

  // The state under DistributedStep::state_buffers()'s names (the tensors themselves, on the
  // device: writing into them changes the state).
  std::vector<std::pair<std::string, torch::Tensor>> state_buffers();
  std::string rng_state() const;
  void set_rng_state(const std::string& text);

 private:
  size_t group() const { return compressed_.size(); }

  comm::Communicator& comm_;
  train::OptimizerOptions options_;
  std::string settings_;
  std::vector<TensorSpec> layout_;
  torch::Device device_;
  std::vector<size_t> compressed_;  // indices into layout_
  std::vector<size_t> dense_;
  std::vector<int64_t> dense_offsets_;
  int64_t dense_numel_ = 0;
  bool grouped_ = false;
  std::unique_ptr<Exchange> exchange_;
  std::unique_ptr<DeviceCompressor> compressor_;
  // Per compressor tensor: the host buffer the exchange decodes into, and on the device the
  // weight-decay momentum b. Per dense tensor (exact path): its momentum u on the device.
  std::vector<std::vector<float>> host_updates_;
  std::vector<torch::Tensor> decay_momentum_;
  std::vector<torch::Tensor> dense_momentum_;
  std::vector<float> dense_flat_;
  std::vector<Selection> selections_;
  int64_t iteration_ = 0;
  struct {
    int64_t total = 0;
    int64_t consecutive = 0;
    int last_bad_ranks = 0;
  } skips_;
  ExchangeBytes total_;
  ExchangeBytes post_warmup_;
  std::vector<double> timings_ = {0.0, 0.0, 0.0};
};

}  // namespace dgc::python
