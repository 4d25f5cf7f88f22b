// The per-worker DGC state for a fixed list of compressed tensors: momentum u and velocity v for
// each, and the step that turns a local gradient into the elements to send.
//
// Two ways to step. step() updates u and v in place. stage() is the same step written into a
// second pair of buffers (u', v') and a copy of the RNG; the committed state (what momentum(),
// velocity(), rng() and checkpoints see) stays as it was until commit() makes the staged state
// the committed one by swapping the buffers, or discard() forgets it. So a distributed step can
// learn from the exchange whether every rank's gradient was finite and only then keep its state,
// without copying u and v before the step (docs/core.md, "Staged steps"). The staged buffers are
// allocated by the first stage() of a tensor: they double the memory of u and v.
//
// Ownership: the Compressor owns u and v; the gradient and the output Selection are the caller's.
// Spans returned by momentum() and velocity() stay valid until the next commit(): it swaps the
// buffers, so a span taken before it shows the old state.
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

  // One DGC step for tensor `t` (docs/algorithm.md steps 2-5):
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

  // The same step as step(), bit for bit (same selection, same u and v, same RNG draws), into the
  // staged buffers: it reads the committed u and v (or, for the RNG, the staged copy, so that
  // several tensors staged in one step draw in sequence as step() would) and writes u', v'.
  // Nothing the committed state holds changes. Each tensor at most once between commits. On a
  // dgc::NumericError the staged state of that step is unusable: discard() it.
  void stage(size_t t, std::span<const float> grad, double density, Selection& out);
  // Makes what stage() wrote since the last commit()/discard() the committed state: for every
  // staged tensor u and v swap with u' and v' (no copy), and the staged RNG becomes the RNG.
  // Tensors not staged keep their state. Throws dgc::InvalidArgument when a stage() since then
  // threw (discard() instead).
  void commit();
  // Forgets what stage() wrote since the last commit(): the committed state is untouched.
  void discard();
  // Whether a stage() is pending (neither committed nor discarded).
  bool staged() const { return staged_rng_active_; }

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
  // The committed one (a stage() draws from a copy until commit()).
  std::mt19937_64& rng() { return rng_; }

 private:
  // step() and stage(): writes tensor t's new u and v into `u`, `v`, reading them from
  // `source_u`, `source_v` (null: in place).
  void run_step(size_t t, std::span<const float> grad, double density, Selection& out,
                std::vector<float>& u, std::vector<float>& v, const float* source_u,
                const float* source_v, std::mt19937_64& rng);

  std::vector<int64_t> numels_;
  CompressionOptions options_;
  std::vector<std::vector<float>> momentum_;
  std::vector<std::vector<float>> velocity_;
  std::mt19937_64 rng_;
  // stage(): u' and v' per tensor (empty until its first stage()), which tensors are staged, the
  // RNG the staged steps draw from, and whether one of them threw.
  std::vector<std::vector<float>> staged_momentum_;
  std::vector<std::vector<float>> staged_velocity_;
  std::vector<uint8_t> is_staged_;
  std::mt19937_64 staged_rng_;
  bool staged_rng_active_ = false;
  bool stage_failed_ = false;

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
// The same, out of place for the residual: reads `residual`, writes the new one to
// `next_residual` (bit for bit what the in-place call leaves in `residual`), so that a caller can
// keep the old residual until it knows the step is kept. The spans may not overlap.
void round_with_residual(std::span<float> values, std::span<const float> residual,
                         std::span<float> next_residual, ValueType type);

}  // namespace dgc
