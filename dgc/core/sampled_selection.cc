// The paper's sampled selection over one tensor (kernels.h, sampled_select): sample, threshold,
// recount below the target, hierarchical top-k above it; and the threshold prediction that lets
// the fused pass (fused_pass.cc) gather the candidates in the same pass as the update.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "dgc/core/kernels.h"
#include "dgc/core/selection.h"

namespace dgc::detail {
namespace {

constexpr float kSmallestPositive = std::numeric_limits<float>::denorm_min();

// Strictly ordered by magnitude, descending; equal magnitudes by lower index first.
bool ranks_before(const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

size_t hit_count(const PassScratch& scratch) {
  size_t count = 0;
  for (const auto& hits : scratch.hit_indices) count += hits.size();
  return count;
}

// Keeps the gathered elements with |v| >= threshold (a threshold at or above the one gathered at).
void filter_hits(PassScratch& scratch, float threshold) {
  for (size_t part = 0; part < scratch.hit_indices.size(); ++part) {
    auto& indices = scratch.hit_indices[part];
    auto& values = scratch.hit_values[part];
    size_t kept = 0;
    for (size_t j = 0; j < indices.size(); ++j) {
      if (std::fabs(values[j]) < threshold) continue;
      indices[kept] = indices[j];
      values[kept] = values[j];
      ++kept;
    }
    indices.resize(kept);
    values.resize(kept);
  }
}

// The `top`-th largest of the sample (the minimum of its top `top` magnitudes).
float top_of_sample(std::vector<float>& sample, size_t top) {
  if (top * 16 <= sample.size()) {
    // Few to keep: a min-heap of the largest so far; most elements fail the first comparison.
    std::vector<float> heap(sample.begin(), sample.begin() + top);
    std::make_heap(heap.begin(), heap.end(), std::greater<float>());
    for (size_t i = top; i < sample.size(); ++i) {
      if (sample[i] > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
        heap.back() = sample[i];
        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
      }
    }
    return heap.front();
  }
  std::nth_element(sample.begin(), sample.begin() + (top - 1), sample.end(), std::greater<float>());
  return sample[top - 1];
}

}  // namespace

float ThresholdHistory::predict() const {
  if (!(last > 0.0f)) return std::numeric_limits<float>::infinity();
  // Linear extrapolation (residuals that have not been sent grow steadily), bounded.
  const float trend = previous > 0.0f ? last - previous : 0.0f;
  return std::clamp(last + trend, 0.5f * last, 2.0f * last) * (1.0f - gap);
}

void ThresholdHistory::record(float sampled, float predicted, size_t gathered, size_t selected) {
  if (std::isfinite(predicted)) {
    if (gathered == SIZE_MAX) {
      gap = std::max(gap * 0.5f, 1e-4f);  // too many candidates: gather closer
    } else if (sampled < predicted) {
      gap = std::min(gap * 2.0f, 0.5f);  // missed: gather further below
    } else if (gathered > 2 * selected) {
      gap = std::max(gap * 0.8f, 1e-4f);
    }
  }
  previous = last;
  last = sampled;
}

void sampled_select(const PassTarget& target, size_t k, double density,
                    const SelectionOptions& options, std::mt19937_64& rng, Selection& out,
                    size_t parts, ThreadPool* pool, PassScratch& scratch, bool reset_on_nonfinite,
                    ThresholdHistory* history) {
  out.clear();
  const size_t n = target.size;
  k = std::min(k, n);
  PassTarget read_only = target;
  read_only.update = Update::kNone;
  read_only.source_momentum = nullptr;
  read_only.source_velocity = nullptr;

  float threshold;    // the selection threshold so far
  float gathered_at;  // scratch.hit_* hold every element with |v| >= gathered_at
  if (k == 0 || k == n) {
    // Nothing to select (update and check only), or every non-zero element.
    threshold = k == 0 ? std::numeric_limits<float>::infinity() : kSmallestPositive;
    fused_pass(target, threshold, parts, pool, scratch);
    throw_if_nonfinite(target, scratch, reset_on_nonfinite);
    gathered_at = threshold;
    if (k == 0) return;
  } else {
    SampleSpec sample;
    sample.count = sample_count(n, density, options.sample_ratio);
    sample.stride = n / sample.count;
    sample.start = static_cast<size_t>(rng() % sample.stride);
    scratch.sample.resize(sample.count);
    sample.out = scratch.sample.data();
    const size_t top = target_count(sample.count, density);
    if (target.update == Update::kNone) {
      gather_sample(target, sample, parts, pool);
      threshold = std::max(top_of_sample(scratch.sample, top), kSmallestPositive);
      fused_pass(target, threshold, parts, pool, scratch);
      throw_if_nonfinite(target, scratch, reset_on_nonfinite);
      gathered_at = threshold;
    } else {
      const float predicted =
          history != nullptr ? history->predict() : std::numeric_limits<float>::infinity();
      fused_pass(target, predicted, parts, pool, scratch, &sample, candidate_cap(k));
      throw_if_nonfinite(target, scratch, reset_on_nonfinite);
      threshold = std::max(top_of_sample(scratch.sample, top), kSmallestPositive);
      const bool complete = std::find(scratch.overflowed.begin(), scratch.overflowed.end(), 1) ==
                            scratch.overflowed.end();
      const size_t gathered = complete ? hit_count(scratch) : SIZE_MAX;
      if (complete && threshold >= predicted) {
        filter_hits(scratch, threshold);  // the candidates hold every |v| >= threshold
      } else {
        fused_pass(read_only, threshold, parts, pool, scratch);
      }
      if (history != nullptr) history->record(threshold, predicted, gathered, hit_count(scratch));
      gathered_at = threshold;
    }
  }

  size_t count = hit_count(scratch);
  const double lower = options.lower_ratio * static_cast<double>(k);
  while (static_cast<double>(count) < lower && out.rounds < options.max_rounds &&
         threshold > kSmallestPositive) {
    threshold =
        std::max(static_cast<float>(threshold * options.threshold_decay), kSmallestPositive);
    ++out.rounds;
    if (threshold >= gathered_at) {
      filter_hits(scratch, threshold);
    } else {
      fused_pass(read_only, threshold, parts, pool, scratch);
      gathered_at = threshold;
    }
    count = hit_count(scratch);
  }

  out.indices.reserve(count);
  out.values.reserve(count);
  for (size_t part = 0; part < scratch.hit_indices.size(); ++part) {
    out.indices.insert(out.indices.end(), scratch.hit_indices[part].begin(),
                       scratch.hit_indices[part].end());
    out.values.insert(out.values.end(), scratch.hit_values[part].begin(),
                      scratch.hit_values[part].end());
  }
  out.threshold = threshold;
  if (static_cast<double>(count) > options.upper_ratio * static_cast<double>(k)) {
    // Hierarchical selection: the exact top-k among the candidates, by magnitude.
    auto& ranked = scratch.ranked;
    ranked.resize(count);
    for (size_t j = 0; j < count; ++j) ranked[j] = {std::fabs(out.values[j]), out.indices[j]};
    std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(), ranks_before);
    out.threshold = ranked[k - 1].first;
    ranked.resize(k);
    std::sort(ranked.begin(), ranked.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    const float* v = target.velocity;
    out.indices.resize(k);
    out.values.resize(k);
    for (size_t j = 0; j < k; ++j) {
      out.indices[j] = ranked[j].second;
      out.values[j] = v[ranked[j].second];
    }
    out.hierarchical = true;
  }
}

}  // namespace dgc::detail
