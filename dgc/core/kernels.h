// Internal kernels shared by momentum.cc, the selection (selection.cc, sampled_selection.cc,
// fused_pass.cc) and compressor.cc. Not part of the API: names and signatures may change without
// notice.
//
// The one full pass of a DGC step: momentum correction fused with the threshold test. The
// update is written once per element by update_one(), which the sampling code uses too, so a
// sampled value equals the value the pass stores bit for bit (the core is built with
// -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "dgc/core/options.h"
#include "dgc/core/selection.h"
#include "dgc/core/thread_pool.h"

namespace dgc::detail {

// Elements per block of the fused pass: the update and a vectorised count of threshold hits run
// over a block; only blocks with a hit are scanned again (from L1), sub-block by sub-block, to
// gather indices. Part boundaries are multiples of kBlock.
inline constexpr size_t kBlock = 64;
inline constexpr size_t kSubBlock = 16;

// The fused pass of a step gathers candidates above a threshold predicted from the sampled
// thresholds of the previous steps of the same tensor. If the step's own sampled threshold is at
// least the prediction, the candidates are a superset of the selection and no second pass runs;
// otherwise (or if more than candidate_cap(k) candidates turned up) one read-only pass counts at
// the sampled threshold. Either way the selection is the same: the prediction only saves a pass.
inline size_t candidate_cap(size_t k) { return 4 * k + 4096; }

// Per tensor: recent sampled thresholds and how far below the extrapolated one to gather.
// The gap adapts: halved after too many candidates, doubled after a miss.
struct ThresholdHistory {
  float last = 0.0f;      // sampled threshold of the last step (0: none yet)
  float previous = 0.0f;  // and of the step before
  float gap = 0.01f;      // gather at (1 - gap) * extrapolated threshold

  // The gather threshold for the next step (+inf when there is no history).
  float predict() const;
  // `gathered`: candidates found at the prediction (SIZE_MAX if over the cap); `selected`:
  // elements at the sampled threshold.
  void record(float sampled, float predicted, size_t gathered, size_t selected);
};

enum class Update : uint8_t { kNone, kPlain, kNesterov };

template <Update kUpdate>
inline float update_one(float& u, float& v, float g, float m) {
  if constexpr (kUpdate == Update::kPlain) {
    const float uu = m * u + g;
    u = uu;
    v = v + uu;
  } else if constexpr (kUpdate == Update::kNesterov) {
    const float uu = m * (u + g);
    u = uu;
    v = v + uu + g;
  }
  return v;
}

// The velocity buffer and, when `update` is not kNone, the momentum update applied to it first.
// Out of place (source_momentum and source_velocity set, both or neither): the update reads u and
// v from the sources and writes them to `momentum` and `velocity`, with the same arithmetic
// (update_one on copies), so the results are bit for bit those of the in-place update and the
// memory traffic is the same (read u, v, g; write u, v). The sources are never written; they may
// not overlap the destinations. Every later read of the pass (sample, gather) is of `velocity`.
struct PassTarget {
  float* velocity = nullptr;
  size_t size = 0;
  Update update = Update::kNone;
  float* momentum = nullptr;    // required unless update == kNone
  const float* grad = nullptr;  // required unless update == kNone
  float m = 0.0f;
  const float* source_momentum = nullptr;  // out of place: u before the step
  const float* source_velocity = nullptr;  // out of place: v before the step
};

// Reusable buffers for one tensor's pass (avoid allocation on the hot path).
struct PassScratch {
  // Per part, ascending: indices with |v| >= the gather threshold and their (finite) v.
  std::vector<std::vector<uint32_t>> hit_indices;
  std::vector<std::vector<float>> hit_values;
  std::vector<std::vector<uint32_t>> nonfinite;  // per part: indices where v is NaN or infinite
  std::vector<uint8_t> overflowed;  // per part: more than its share of the cap; gathering stopped
  std::vector<float> sample;
  std::vector<std::pair<float, uint32_t>> ranked;
};

// Sample positions start + i * stride for i < count; |v| after the update goes to out[i]
// (non-finite values as 0: the pass reports those).
struct SampleSpec {
  size_t start = 0;
  size_t stride = 1;
  size_t count = 0;
  float* out = nullptr;
};

// Number of contiguous parts a tensor of `numel` elements is split into for `threads` threads.
size_t part_count(size_t numel, int threads, int64_t min_numel_per_part);

// Applies the update (if any) to every element, takes the sample if `sample` is given, and
// gathers the elements with !(|v| < threshold) into scratch.hit_* (finite) and
// scratch.nonfinite, each in ascending order when the parts are concatenated.
// `threshold` = +inf gathers only the non-finite elements. A part that gathers more than its
// share of `cap` finite elements stops gathering them (scratch.overflowed[part] = 1).
void fused_pass(const PassTarget& target, float threshold, size_t parts, ThreadPool* pool,
                PassScratch& scratch, const SampleSpec* sample = nullptr, size_t cap = SIZE_MAX);

// Gathers |v| at the sample positions of an already updated velocity into spec.out (the
// read-only path of sampled_select), non-finite values as 0, over at most `parts` parts.
void gather_sample(const PassTarget& t, const SampleSpec& spec, size_t parts, ThreadPool* pool);

// If the last fused_pass found non-finite velocities: with `reset_state`, zeroes u and v there;
// then throws dgc::NumericError naming the first index.
void throw_if_nonfinite(const PassTarget& target, PassScratch& scratch, bool reset_state);

// The paper's sampled selection (see select_sampled) over `target`.
// With target.update == kNone the sample is gathered first, then one counting pass runs.
// Otherwise the momentum update runs in the first full pass, which also takes the sample and
// gathers candidates above history->predict() (see kPredictionMargin); the history is updated.
void sampled_select(const PassTarget& target, size_t k, double density,
                    const SelectionOptions& options, std::mt19937_64& rng, Selection& out,
                    size_t parts, ThreadPool* pool, PassScratch& scratch, bool reset_on_nonfinite,
                    ThresholdHistory* history = nullptr);

// Exact top-k of |velocity| (ties by lower index) into out.indices/values/threshold.
void exact_select(std::span<const float> velocity, size_t k, Selection& out);

}  // namespace dgc::detail
