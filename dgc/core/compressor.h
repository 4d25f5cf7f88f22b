// The per-worker DGC state for a fixed list of compressed tensors: momentum u and velocity v for
// each, and the step that turns a local gradient into the elements to send.
//
// Ownership: the Compressor owns u and v; the gradient and the output Selection are the caller's.
// Thread-safety: one Compressor per worker; calls on different tensors may not overlap.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "dgc/core/options.h"
#include "dgc/core/selection.h"

namespace dgc {

class Compressor {
 public:
  // One entry per compressed tensor: its number of elements. u and v start at zero.
  Compressor(std::vector<int64_t> numels, CompressionOptions options);
  // Copies carry the state (u, v, rng), not the thread pool or scratch buffers.
  Compressor(const Compressor& other);
  Compressor& operator=(const Compressor& other);
  Compressor(Compressor&& other) noexcept;
  Compressor& operator=(Compressor&& other) noexcept;
  ~Compressor();

  size_t num_tensors() const { return numels_.size(); }
  const CompressionOptions& options() const { return options_; }

  // One DGC step for tensor `t` (DGC.md steps 2-5):
  //   accumulate_velocity(u, v, grad); select with `density`; mask_sent at the selection with the
  //   values as they will be decoded (rounded to options.value_type).
  // On return `out` holds the sorted indices and the (rounded) values to send. Gradient clipping,
  // if any, is the caller's, before this call. Throws dgc::NumericError on NaN in the gradient.
  //
  // Details:
  // - density in (0, 1]; k = target_count(numel, density). Elements with v == 0 are never sent
  //   (also with SelectionMethod::kExact, which may then send fewer than k).
  // - The sampled method makes one full pass over the tensor: the momentum update, the strided
  //   sample (taken from the updated values of the block in cache) and the gathering of
  //   candidates above a threshold predicted from this tensor's previous steps. When the
  //   sampled threshold is at least the prediction the candidates are filtered and that is all;
  //   otherwise (first step, a miss, too many candidates) one read-only pass counts at the
  //   sampled threshold, and each threshold-decay round may read once more. The selection is the
  //   one select_sampled gives on the updated velocity with the same rng state; the prediction
  //   only decides how many passes it takes. Momentum m is applied in fp32.
  // - With options.threads > 1 and numel >= 2 * min_numel_per_thread the tensor is split into
  //   contiguous ranges processed by a pool the Compressor owns. Results are identical for
  //   every thread count.
  // - Non-finite values (NaN/Inf in the gradient, or an overflow) throw dgc::NumericError naming
  //   the tensor and the first index. The step has then been applied to the other elements,
  //   and u and v are reset to zero where they were non-finite, so the state stays finite. To
  //   skip a bad step without touching the state, check the gradients first (squared_norm in
  //   clip.h is non-finite iff a gradient is).
  void step(size_t t, std::span<const float> grad, double density, Selection& out);

  // Gives back to the velocity (the residual) what step() selected for tensor `t` but the
  // exchange did not apply: v[index] += value for every element of `unapplied` (indices < numel;
  // values as step() returned them). step() masked v at those positions, so v then holds what it
  // would have held had they never been selected; the momentum u stays masked there (as after a
  // send), so stale momentum does not push them again.
  void return_to_velocity(size_t t, const Selection& unapplied);

  std::span<float> momentum(size_t t);
  std::span<float> velocity(size_t t);
  std::span<const float> momentum(size_t t) const;
  std::span<const float> velocity(size_t t) const;

  // RNG state (for checkpoints): serialised as text by the standard library's operator<<.
  std::mt19937_64& rng() { return rng_; }

 private:
  std::vector<int64_t> numels_;
  CompressionOptions options_;
  std::vector<std::vector<float>> momentum_;
  std::vector<std::vector<float>> velocity_;
  std::mt19937_64 rng_;

  struct Workspace;  // thread pool and scratch buffers: not part of the state
  Workspace& workspace();
  std::unique_ptr<Workspace> workspace_;
};

// Value as the receiver decodes it after rounding to `type` (identity for kFloat32;
// round-to-nearest-even for fp16 and bf16). Finite values beyond the 16-bit range saturate to
// the largest finite value of the format (see float16.h), so the excess stays in the residual.
float round_to(float value, ValueType type);

// Rounding with error feedback: for every element, x = values[i] + residual[i];
// values[i] = round_to(x, type); residual[i] = x - values[i]. What rounding drops stays in the
// residual and goes out in a later call, so the sum of the rounded values over T calls equals
// the sum of the inputs minus the last residual (up to fp32 rounding of the additions). Non-finite
// inputs give non-finite values (check first). values.size() == residual.size().
void round_with_residual(std::span<float> values, std::span<float> residual, ValueType type);

}  // namespace dgc
