// Plain, obviously correct reference implementations of the core's fast kernels, and test data.
// Every loop here is the textbook one: full scans, full sorts, no blocking, no threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/core/options.h"
#include "dgc/core/selection.h"

namespace dgc::test {

inline constexpr float kSmallestPositive = std::numeric_limits<float>::denorm_min();

// Normal(0, scale) values from a seeded generator.
inline std::vector<float> normal_values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

// Small integers in [-range, range]: many exact ties and zeros.
inline std::vector<float> tied_values(size_t n, uint64_t seed, int range = 3) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(-range, range);
  std::vector<float> out(n);
  for (float& x : out) x = static_cast<float>(pick(rng));
  return out;
}

// docs/algorithm.md step 2, written out.
inline void reference_accumulate(std::vector<float>& u, std::vector<float>& v,
                                 const std::vector<float>& g, const MomentumOptions& o) {
  const float m = static_cast<float>(o.factor);
  for (size_t i = 0; i < g.size(); ++i) {
    if (o.nesterov) {
      u[i] = m * (u[i] + g[i]);
      v[i] = v[i] + u[i] + g[i];
    } else {
      u[i] = m * u[i] + g[i];
      v[i] = v[i] + u[i];
    }
  }
}

// Sorts indices by |v| descending, ties by lower index, keeps the first k, returns them sorted.
inline std::vector<uint32_t> top_k_by_magnitude(const std::vector<float>& v,
                                                std::vector<uint32_t> candidates, size_t k) {
  std::sort(candidates.begin(), candidates.end(), [&](uint32_t a, uint32_t b) {
    const float ma = std::fabs(v[a]), mb = std::fabs(v[b]);
    return ma > mb || (ma == mb && a < b);
  });
  candidates.resize(std::min(k, candidates.size()));
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

inline Selection reference_exact(const std::vector<float>& v, size_t k) {
  std::vector<uint32_t> all(v.size());
  for (size_t i = 0; i < v.size(); ++i) all[i] = static_cast<uint32_t>(i);
  Selection out;
  out.indices = top_k_by_magnitude(v, all, k);
  for (uint32_t i : out.indices) out.values.push_back(v[i]);
  return out;
}

// The sample positions start + i * stride, i < count, of a tensor (one draw from rng).
struct SamplePositions {
  size_t start, stride, count;
};
inline SamplePositions reference_sample_positions(size_t n, double density,
                                                  const SelectionOptions& o, std::mt19937_64& rng) {
  const size_t count = sample_count(n, density, o.sample_ratio);
  const size_t stride = n / count;
  return {static_cast<size_t>(rng() % stride), stride, count};
}

// The threshold estimated from the strided sample, before any decay.
inline float reference_sampled_threshold(const std::vector<float>& v, double density,
                                         const SelectionOptions& o, std::mt19937_64& rng) {
  const SamplePositions p = reference_sample_positions(v.size(), density, o, rng);
  std::vector<float> sample;
  for (size_t i = 0; i < p.count; ++i) {
    const float magnitude = std::fabs(v[p.start + i * p.stride]);
    sample.push_back(std::isfinite(magnitude) ? magnitude : 0.0f);
  }
  std::sort(sample.begin(), sample.end(), std::greater<float>());
  return std::max(sample[target_count(p.count, density) - 1], kSmallestPositive);
}

// The sampled selection exactly as selection.h specifies it, with full scans and sorts.
inline Selection reference_sampled(const std::vector<float>& v, size_t k, double density,
                                   const SelectionOptions& o, std::mt19937_64& rng) {
  const size_t n = v.size();
  k = std::min(k, n);
  Selection out;
  if (k == 0) return out;
  float thr = k < n ? reference_sampled_threshold(v, density, o, rng) : kSmallestPositive;
  auto collect = [&](float t) {
    std::vector<uint32_t> selected;
    for (size_t i = 0; i < n; ++i) {
      if (std::fabs(v[i]) >= t) selected.push_back(static_cast<uint32_t>(i));
    }
    return selected;
  };
  std::vector<uint32_t> selected = collect(thr);
  while (static_cast<double>(selected.size()) < o.lower_ratio * static_cast<double>(k) &&
         out.rounds < o.max_rounds && thr > kSmallestPositive) {
    thr = std::max(static_cast<float>(thr * o.threshold_decay), kSmallestPositive);
    ++out.rounds;
    selected = collect(thr);
  }
  out.threshold = thr;
  if (static_cast<double>(selected.size()) > o.upper_ratio * static_cast<double>(k)) {
    selected = top_k_by_magnitude(v, selected, k);
    out.hierarchical = true;
    out.threshold = std::fabs(v[selected.front()]);
    for (uint32_t i : selected) out.threshold = std::min(out.threshold, std::fabs(v[i]));
  }
  out.indices = selected;
  for (uint32_t i : selected) out.values.push_back(v[i]);
  return out;
}

// One reference DGC step (docs/algorithm.md steps 2-5) on one tensor's state. `rng` is the
// generator of the whole Compressor (one per worker, drawn in call order).
struct ReferenceState {
  std::vector<float> u, v;
  explicit ReferenceState(size_t n) : u(n, 0.0f), v(n, 0.0f) {}
};

inline Selection reference_step(ReferenceState& s, const std::vector<float>& g, double density,
                                const CompressionOptions& o, std::mt19937_64& rng) {
  reference_accumulate(s.u, s.v, g, o.momentum);
  const size_t k = target_count(g.size(), density);
  Selection out;
  if (o.selection.method == SelectionMethod::kSampled) {
    out = reference_sampled(s.v, k, density, o.selection, rng);
  } else {
    Selection exact = reference_exact(s.v, k);
    for (size_t j = 0; j < exact.indices.size(); ++j) {
      if (exact.values[j] == 0.0f) continue;
      out.indices.push_back(exact.indices[j]);
      out.values.push_back(exact.values[j]);
    }
  }
  for (size_t j = 0; j < out.indices.size(); ++j) {
    const uint32_t i = out.indices[j];
    out.values[j] = round_to(out.values[j], o.value_type);
    s.v[i] = s.v[i] - out.values[j];
    if (o.momentum.masking) s.u[i] = 0.0f;
  }
  return out;
}

}  // namespace dgc::test
