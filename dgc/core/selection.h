// Threshold selection (docs/algorithm.md step 3): which elements of the velocity are sent.
//
// Output indices are sorted ascending and unique; values are v[index] as found.
// Buffers in `Selection` are reused across calls to avoid allocation on the hot path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "dgc/core/options.h"

namespace dgc {

struct Selection {
  std::vector<uint32_t> indices;  // sorted ascending
  std::vector<float> values;      // velocity at indices
  float threshold = 0.0f;         // final |v| threshold used (exact: k-th largest magnitude)
  int rounds = 0;                 // threshold decay rounds taken (sampled method)
  bool hierarchical = false;      // true if an exact top-k among candidates trimmed the set
  void clear() {
    indices.clear();
    values.clear();
    threshold = 0.0f;
    rounds = 0;
    hierarchical = false;
  }
};

// Throws dgc::InvalidArgument unless density is in (0, 1]: the one range check of a density,
// wherever one enters (flags, options, the core's entry points). `what` names it in the message
// ("density", "--density", "dense-path density").
void check_density(double density, const char* what = "density");

// k = ceil(density * numel), at least 1 when numel > 0 and density > 0, at most numel.
// density >= 1 gives numel; density <= 0 gives 0.
size_t target_count(size_t numel, double density);

// Number of samples used for a tensor of `numel` elements:
// min(numel, max(ceil(sample_ratio * numel), ceil(2 / density))).
// (Both ceilings forgive a relative error of 1e-9 in the product, so 0.1 * 30 counts as 3.)
size_t sample_count(size_t numel, double density, double sample_ratio);

// Exact top-k by magnitude (nth_element style): every kept |v| >= every dropped |v|.
// Ties at the threshold are broken by lower index. Exactly min(k, numel) elements (zeros too,
// if k exceeds the non-zero count). out.threshold = the k-th largest |v|. Allocates a copy of
// the magnitudes. NaN in velocity throws dgc::NumericError.
void select_exact(std::span<const float> velocity, size_t k, Selection& out);

// The paper's sampled selection. Strided sample with a random start drawn from `rng`; threshold =
// min of the top ceil(density*samples) sample magnitudes; count |v| >= thr; if count > upper*k
// take the exact top-k among the candidates (hierarchical); if count < lower*k multiply thr by
// decay and recount, at most max_rounds times. `threads` > 1 splits counting and gathering over
// disjoint ranges; the result does not depend on it.
// Elements with v == 0 are never selected. NaN in velocity throws dgc::NumericError.
//
// Exactly, so that a reference can reproduce it (k is first capped at numel):
// - k == 0: nothing is selected and rng is not used. k == numel: every non-zero element is
//   selected, rng is not used.
// - otherwise s = sample_count(numel, density, sample_ratio), stride = numel / s (integer
//   division), start = rng() % stride (one draw), sample = |v[start + i*stride]| for i < s
//   (non-finite values count as 0), thr = the target_count(s, density)-th largest sample value,
//   raised to the smallest positive float if smaller (so zeros are never selected);
// - selected = {i : |v[i]| >= thr}; while |selected| < lower_ratio * k and fewer than max_rounds
//   rounds were taken and thr is above the smallest positive float:
//   thr = max(float(thr * threshold_decay), smallest positive float), recount;
// - if |selected| > upper_ratio * k: keep the k largest |v|, ties by lower index
//   (hierarchical = true, threshold = the k-th largest |v|); otherwise threshold = thr.
// - `threads` > 1 starts that many threads for this call (Compressor keeps a pool instead).
void select_sampled(std::span<const float> velocity, size_t k, double density,
                    const SelectionOptions& options, std::mt19937_64& rng, Selection& out,
                    int threads = 1);

}  // namespace dgc
