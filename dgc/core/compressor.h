// The per-worker DGC state for a fixed list of compressed tensors: momentum u and velocity v for
// each, and the step that turns a local gradient into the elements to send.
//
// Ownership: the Compressor owns u and v; the gradient and the output Selection are the caller's.
// Thread-safety: one Compressor per worker; calls on different tensors may not overlap.
#pragma once

#include <cstdint>
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

  size_t num_tensors() const { return numels_.size(); }
  const CompressionOptions& options() const { return options_; }

  // One DGC step for tensor `t` (DGC.md steps 2-5):
  //   accumulate_velocity(u, v, grad); select with `density`; mask_sent at the selection with the
  //   values as they will be decoded (rounded to options.value_type).
  // On return `out` holds the sorted indices and the (rounded) values to send. Gradient clipping,
  // if any, is the caller's, before this call. Throws dgc::NumericError on NaN in the gradient.
  void step(size_t t, std::span<const float> grad, double density, Selection& out);

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
};

// Value as the receiver decodes it after rounding to `type` (identity for kFloat32;
// round-to-nearest-even for fp16 and bf16).
float round_to(float value, ValueType type);

}  // namespace dgc
