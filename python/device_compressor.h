// The DGC step of dgc::Compressor (dgc/core/compressor.h) written with libtorch tensor
// operations, so that it runs on the device the tensors live on (CUDA for a GPU model, the CPU
// for the tests): momentum correction, threshold selection (sampled or exact), rounding of the
// values to the wire type, momentum factor masking. What leaves the device is the selection
// (indices and values, a few KB), never the gradient or the state.
//
// Same step as the core, so that the hook gives the same result on either:
// - momentum correction in fp32, operation by operation as dgc::detail::update_one
//   (plain: u = m*u + g; v = v + u. Nesterov: u = m*(u + g); v = (v + u) + g), each operation a
//   separate libtorch kernel, so nothing is fused into an FMA;
// - SelectionMethod::kExact: the min(k, numel) largest |v|, ties at the k-th largest broken by
//   lower index, then the zeros dropped: the core's set, bit for bit;
// - SelectionMethod::kSampled: the core's sample (one draw of the RNG for the random start, the
//   same stride and count), its threshold (the target_count(s, d)-th largest sampled |v|, at least
//   the smallest positive float), the same decay rounds on the count and the same hierarchical
//   exact top-k when the count exceeds upper_ratio * k. On CPU tensors the selection equals
//   select_sampled on the same velocity with the same RNG state: the threshold is the same float,
//   so the set is the same (the tests check both);
// - values rounded as round_to(): fp16 and bf16 round to nearest even and saturate at the
//   format's largest finite value;
// - masking: v[i] -= sent[i] (0 for fp32), and u[i] = 0 with options.momentum.masking.
// Each step synchronises with the host a few times (the finite check, the sampled threshold, the
// number of candidates per threshold tried); the passes over the tensor are libtorch's own
// kernels: the momentum update (3 kernels), |v|, its maximum, one comparison and nonzero per
// threshold tried, gathers and scatters of the k selected elements. About 12 element-wise reads
// and writes of the tensor where a fused kernel would need 5 (read u, v, g; write u, v).
//
// Staging, as Compressor::stage/commit/discard: stage() writes the new u and v into new tensors
// (the ops are out of place) and draws from a copy of the RNG; the committed state changes only
// at commit(). A non-finite velocity throws dgc::NumericError naming the tensor; the staged step
// is then unusable (discard()).
//
// Ownership: the DeviceCompressor owns u and v (tensors on `device`); the gradient is the
// caller's and is only read. Thread-safety: one per worker; not safe to share.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <vector>

#include "dgc/core/options.h"
#include "dgc/core/selection.h"

namespace dgc::python {

// A selection on the device: what one compressed tensor sends this step.
struct DeviceSelection {
  torch::Tensor indices;  // int64, ascending, on the compressor's device
  torch::Tensor values;   // float32, v[index] rounded to the value type (what receivers decode)
  float threshold = 0.0f;
  int rounds = 0;
  bool hierarchical = false;
  // The same selection in the core's type (a copy to the host of indices and values).
  Selection to_host() const;
};

class DeviceCompressor {
 public:
  // One entry per compressed tensor: its number of elements. u and v start at zero on `device`.
  // options.threads and min_numel_per_thread are ignored (the device parallelises).
  DeviceCompressor(std::vector<int64_t> numels, CompressionOptions options, torch::Device device);

  size_t num_tensors() const { return numels_.size(); }
  const CompressionOptions& options() const { return options_; }
  torch::Device device() const { return device_; }

  // Compressor::step: stage() and commit() of this one tensor.
  void step(size_t t, const torch::Tensor& grad, double density, DeviceSelection& out);
  // Compressor::stage: the step of tensor t into the staged state; `grad` has numel(t)
  // elements, is float32 and on the compressor's device (any shape; read as a flat tensor).
  void stage(size_t t, const torch::Tensor& grad, double density, DeviceSelection& out);
  void commit();
  void discard();

  // Selection alone (no momentum update, no masking), for the tests and benchmarks: the indices
  // and values of `velocity` the step would send at `density`, drawing from `rng` as the core's
  // select_sampled does.
  void select(const torch::Tensor& velocity, double density, std::mt19937_64& rng,
              DeviceSelection& out) const;

  // The committed state of tensor t (flat, on the device). Writing into them changes the state.
  torch::Tensor& momentum(size_t t);
  torch::Tensor& velocity(size_t t);
  std::mt19937_64& rng() { return rng_; }

 private:
  // select() of a flat velocity whose |v| is `magnitude`.
  void select_magnitudes(const torch::Tensor& v, const torch::Tensor& magnitude, double density,
                         std::mt19937_64& rng, DeviceSelection& out) const;

  std::vector<int64_t> numels_;
  CompressionOptions options_;
  torch::Device device_;
  std::vector<torch::Tensor> momentum_;
  std::vector<torch::Tensor> velocity_;
  std::mt19937_64 rng_;
  // stage(): the new u and v of staged tensors (undefined where not staged), the RNG the staged
  // steps draw from, and whether one of them threw.
  std::vector<torch::Tensor> staged_momentum_;
  std::vector<torch::Tensor> staged_velocity_;
  std::mt19937_64 staged_rng_;
  bool staged_rng_active_ = false;
  bool stage_failed_ = false;
};

// The k largest |magnitudes| (a float tensor), ties at the k-th largest by lower position, as a
// bool mask; `kth` receives the k-th largest magnitude. 0 < k <= magnitudes.numel().
torch::Tensor top_k_mask(const torch::Tensor& magnitudes, int64_t k, float& kth);

// round_to() of every value (ValueType::kFloat32: the values themselves).
torch::Tensor round_values(const torch::Tensor& values, ValueType type);

}  // namespace dgc::python
