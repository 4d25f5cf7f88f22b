#include "dgc/core/selection.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "dgc/core/error.h"
#include "dgc/core/kernels.h"
#include "dgc/core/thread_pool.h"

namespace dgc {
namespace {

// ceil(x) that forgives the last bits of a product like 0.1 * 30 = 3.0000000000000004.
size_t tolerant_ceil(double x) {
  return static_cast<size_t>(std::ceil(x - 1e-9 * std::max(1.0, x)));
}

constexpr float kSmallestPositive = std::numeric_limits<float>::denorm_min();

// Strictly ordered by magnitude, descending; equal magnitudes by lower index first.
bool ranks_before(const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

struct PartOutput {
  std::vector<uint32_t>& indices;
  std::vector<float>& values;
  std::vector<uint32_t>& nonfinite;
  uint8_t& overflowed;
  size_t cap;
};

// One element's update, in place (su, sv unused) or out of place (from su, sv into u, v).
template <detail::Update kUpdate, bool kOutOfPlace>
inline float update_at(float* __restrict u, float* __restrict v, const float* __restrict su,
                       const float* __restrict sv, const float* __restrict g, float m, size_t i) {
  if constexpr (kOutOfPlace) {
    float uu = su[i];
    float vv = sv[i];
    const float vi = detail::update_one<kUpdate>(uu, vv, g[i], m);
    u[i] = uu;
    v[i] = vv;
    return vi;
  } else {
    return detail::update_one<kUpdate>(u[i], v[i], g[i], m);
  }
}

// Updates (if kUpdate) and counts !(|v| < threshold) over `size` elements: NaN counts too.
// With a compile-time `size` the loop vectorises without a remainder.
template <detail::Update kUpdate, size_t kSize, bool kOutOfPlace = false>
inline uint32_t update_and_count(float* __restrict u, float* __restrict v,
                                 const float* __restrict su, const float* __restrict sv,
                                 const float* __restrict g, float m, float threshold) {
  uint32_t count = 0;
  for (size_t i = 0; i < kSize; ++i) {
    float vi;
    if constexpr (kUpdate == detail::Update::kNone) {
      vi = v[i];
    } else {
      vi = update_at<kUpdate, kOutOfPlace>(u, v, su, sv, g, m, i);
    }
    count += !(std::fabs(vi) < threshold);
  }
  return count;
}

// Appends the elements of v[begin, end) with !(|v| < threshold): finite ones as candidates,
// the others (NaN, infinity) to out.nonfinite.
inline void gather(const float* v, size_t begin, size_t end, float threshold, PartOutput& out) {
  for (size_t i = begin; i < end; ++i) {
    const float vi = v[i];
    if (!(std::fabs(vi) < threshold)) {
      if (std::isfinite(vi)) {
        out.indices.push_back(static_cast<uint32_t>(i));
        out.values.push_back(vi);
      } else {
        out.nonfinite.push_back(static_cast<uint32_t>(i));
      }
    }
  }
}

template <detail::Update kUpdate, bool kOutOfPlace = false>
void pass_range(const detail::PassTarget& t, size_t begin, size_t end, float threshold,
                const detail::SampleSpec* sample, PartOutput out) {
  constexpr size_t kBlock = detail::kBlock;
  constexpr size_t kSub = detail::kSubBlock;
  float* __restrict v = t.velocity;
  float* __restrict u = t.momentum;
  const float* __restrict su = t.source_momentum;
  const float* __restrict sv = t.source_velocity;
  const float* __restrict g = t.grad;
  const float m = t.m;
  // The sample positions inside [begin, end): start + i * stride for i in [next, last).
  size_t next = 0, last = 0, position = 0;
  if (sample != nullptr && sample->count > 0) {
    next =
        begin > sample->start ? (begin - sample->start + sample->stride - 1) / sample->stride : 0;
    last = end > sample->start ? (end - sample->start + sample->stride - 1) / sample->stride : 0;
    last = std::min(last, sample->count);
    position = sample->start + next * sample->stride;
  }
  auto take_sample = [&](size_t block_end) {
    for (; next < last && position < block_end; ++next, position += sample->stride) {
      const float magnitude = std::fabs(v[position]);
      sample->out[next] = std::isfinite(magnitude) ? magnitude : 0.0f;
    }
  };
  size_t block = begin;
  for (; block + kBlock <= end; block += kBlock) {
    // u and g are null for a pass without an update: no offset on them (UB on a null pointer).
    const uint32_t count = update_and_count<kUpdate, kBlock, kOutOfPlace>(
        kUpdate == detail::Update::kNone ? nullptr : u + block, v + block,
        kOutOfPlace ? su + block : nullptr, kOutOfPlace ? sv + block : nullptr,
        kUpdate == detail::Update::kNone ? nullptr : g + block, m, threshold);
    take_sample(block + kBlock);
    if (count == 0) continue;
    // Narrow down to the sub-blocks with a hit (the block is in L1), then gather.
    for (size_t sub = block; sub < block + kBlock; sub += kSub) {
      if (update_and_count<detail::Update::kNone, kSub>(nullptr, v + sub, nullptr, nullptr, nullptr,
                                                        m, threshold)) {
        gather(v, sub, sub + kSub, threshold, out);
      }
    }
    if (out.indices.size() > out.cap) {
      // Too many candidates: from here on gather only non-finite elements.
      threshold = std::numeric_limits<float>::infinity();
      out.overflowed = 1;
    }
  }
  for (size_t i = block; i < end; ++i) {  // the last partial block
    if constexpr (kUpdate != detail::Update::kNone)
      update_at<kUpdate, kOutOfPlace>(u, v, su, sv, g, m, i);
  }
  take_sample(end);
  gather(v, block, end, threshold, out);
}

void pass_part(const detail::PassTarget& t, size_t begin, size_t end, float threshold,
               const detail::SampleSpec* sample, PartOutput out) {
  out.indices.clear();
  out.values.clear();
  out.nonfinite.clear();
  out.overflowed = 0;
  const bool out_of_place = t.source_velocity != nullptr;
  switch (t.update) {
    case detail::Update::kNone:
      return pass_range<detail::Update::kNone>(t, begin, end, threshold, sample, out);
    case detail::Update::kPlain:
      return out_of_place
                 ? pass_range<detail::Update::kPlain, true>(t, begin, end, threshold, sample, out)
                 : pass_range<detail::Update::kPlain>(t, begin, end, threshold, sample, out);
    case detail::Update::kNesterov:
      return out_of_place
                 ? pass_range<detail::Update::kNesterov, true>(t, begin, end, threshold, sample,
                                                               out)
                 : pass_range<detail::Update::kNesterov>(t, begin, end, threshold, sample, out);
  }
}

size_t part_begin(size_t part, size_t parts, size_t size) {
  if (part == 0) return 0;
  if (part >= parts) return size;
  const size_t begin = (part * size / parts) / detail::kBlock * detail::kBlock;
  return std::min(begin, size);
}

// Runs task(part, begin, end) for every part, on the pool when there is one.
template <typename Task>
void for_each_part(size_t parts, size_t size, ThreadPool* pool, const Task& task) {
  auto one = [&](size_t part) {
    task(part, part_begin(part, parts, size), part_begin(part + 1, parts, size));
  };
  if (pool == nullptr || parts == 1) {
    for (size_t part = 0; part < parts; ++part) one(part);
  } else {
    pool->run(parts, one);
  }
}

size_t hit_count(const detail::PassScratch& scratch) {
  size_t count = 0;
  for (const auto& hits : scratch.hit_indices) count += hits.size();
  return count;
}

// Keeps the gathered elements with |v| >= threshold (a threshold at or above the one gathered at).
void filter_hits(detail::PassScratch& scratch, float threshold) {
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

// Gathers |v| at the sample positions of an already updated velocity (the read-only path).
void gather_sample(const detail::PassTarget& t, const detail::SampleSpec& spec, size_t parts,
                   ThreadPool* pool) {
  const size_t sample_parts = std::min(parts, std::max<size_t>(1, spec.count / 4096));
  for_each_part(sample_parts, spec.count, pool, [&](size_t, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float magnitude = std::fabs(t.velocity[spec.start + i * spec.stride]);
      spec.out[i] = std::isfinite(magnitude) ? magnitude : 0.0f;
    }
  });
}

void check_selection_options(const SelectionOptions& o) {
  DGC_CHECK(o.sample_ratio > 0.0 && o.sample_ratio <= 1.0, "sample_ratio must be in (0, 1], got ",
            o.sample_ratio);
  DGC_CHECK(o.lower_ratio >= 0.0 && o.lower_ratio <= 1.0, "lower_ratio must be in [0, 1], got ",
            o.lower_ratio);
  DGC_CHECK(o.upper_ratio >= 1.0, "upper_ratio must be >= 1, got ", o.upper_ratio);
  DGC_CHECK(o.threshold_decay > 0.0 && o.threshold_decay < 1.0,
            "threshold_decay must be in (0, 1), got ", o.threshold_decay);
  DGC_CHECK_GE(o.max_rounds, 0, "max_rounds must not be negative");
}

}  // namespace

size_t target_count(size_t numel, double density) {
  if (numel == 0 || !(density > 0.0)) return 0;
  if (density >= 1.0) return numel;
  return std::clamp<size_t>(tolerant_ceil(density * static_cast<double>(numel)), 1, numel);
}

void check_density(double density, const char* what) {
  DGC_CHECK(density > 0.0 && density <= 1.0, what, " must be in (0, 1], got ", density);
}

size_t sample_count(size_t numel, double density, double sample_ratio) {
  if (numel == 0) return 0;
  DGC_CHECK(density > 0.0, "density must be positive, got ", density);
  const size_t by_ratio = tolerant_ceil(sample_ratio * static_cast<double>(numel));
  const double by_density = std::ceil(2.0 / density - 1e-9);
  if (by_density >= static_cast<double>(numel)) return numel;
  return std::clamp<size_t>(std::max(by_ratio, static_cast<size_t>(by_density)), 1, numel);
}

void select_exact(std::span<const float> velocity, size_t k, Selection& out) {
  detail::exact_select(velocity, k, out);
}

void select_sampled(std::span<const float> velocity, size_t k, double density,
                    const SelectionOptions& options, std::mt19937_64& rng, Selection& out,
                    int threads) {
  check_density(density);
  DGC_CHECK_GE(threads, 1, "threads must be at least 1");
  DGC_CHECK_LE(velocity.size(), size_t{std::numeric_limits<uint32_t>::max()},
               "indices are 32-bit: split larger tensors");
  check_selection_options(options);
  detail::PassTarget target;
  target.velocity = const_cast<float*>(velocity.data());  // kNone: only read
  target.size = velocity.size();
  // Parts of at least 4096 elements: enough to split test-sized tensors, cheap to schedule.
  const size_t parts = detail::part_count(velocity.size(), threads, 4096);
  std::optional<ThreadPool> pool;
  if (parts > 1) pool.emplace(static_cast<int>(parts));
  detail::PassScratch scratch;
  detail::sampled_select(target, k, density, options, rng, out, parts, pool ? &*pool : nullptr,
                         scratch, /*reset_on_nonfinite=*/false);
}

namespace detail {

size_t part_count(size_t numel, int threads, int64_t min_numel_per_part) {
  if (threads <= 1) return 1;
  const size_t per_part = static_cast<size_t>(std::max<int64_t>(min_numel_per_part, 1));
  return std::clamp<size_t>(numel / per_part, 1, static_cast<size_t>(threads));
}

void fused_pass(const PassTarget& target, float threshold, size_t parts, ThreadPool* pool,
                PassScratch& scratch, const SampleSpec* sample, size_t cap) {
  parts = std::max<size_t>(parts, 1);
  scratch.hit_indices.resize(parts);
  scratch.hit_values.resize(parts);
  scratch.nonfinite.resize(parts);
  scratch.overflowed.assign(parts, 0);
  for_each_part(parts, target.size, pool, [&](size_t part, size_t begin, size_t end) {
    const size_t part_cap =
        cap == SIZE_MAX
            ? SIZE_MAX
            : static_cast<size_t>(static_cast<double>(cap) * static_cast<double>(end - begin) /
                                  static_cast<double>(target.size)) +
                  kBlock;
    pass_part(target, begin, end, threshold, sample,
              PartOutput{scratch.hit_indices[part], scratch.hit_values[part],
                         scratch.nonfinite[part], scratch.overflowed[part], part_cap});
  });
}

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

void throw_if_nonfinite(const PassTarget& target, PassScratch& scratch, bool reset_state) {
  size_t count = 0;
  std::optional<uint32_t> first;
  for (const auto& bad : scratch.nonfinite) {
    if (!bad.empty() && !first) first = bad.front();
    count += bad.size();
  }
  if (count == 0) return;
  const float found = target.velocity[*first];
  if (reset_state) {
    for (const auto& bad : scratch.nonfinite) {
      for (uint32_t i : bad) {
        target.velocity[i] = 0.0f;
        if (target.momentum != nullptr) target.momentum[i] = 0.0f;
      }
    }
  }
  throw NumericError(detail::concat(
      "non-finite velocity (", found, ") at index ", *first, ", ", count, " of ", target.size,
      " elements: the gradient or the accumulated state holds NaN or infinity",
      reset_state ? "; momentum and velocity at those elements were reset to zero" : ""));
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

void exact_select(std::span<const float> velocity, size_t k, Selection& out) {
  out.clear();
  const size_t n = velocity.size();
  DGC_CHECK_LE(n, size_t{std::numeric_limits<uint32_t>::max()},
               "indices are 32-bit: split larger tensors");
  k = std::min(k, n);
  if (k == 0) return;
  std::vector<float> magnitudes(n);
  uint32_t nan_count = 0;
  for (size_t i = 0; i < n; ++i) {
    magnitudes[i] = std::fabs(velocity[i]);
    nan_count += std::isnan(velocity[i]);
  }
  if (nan_count > 0) {
    const size_t first =
        std::find_if(velocity.begin(), velocity.end(), [](float x) { return std::isnan(x); }) -
        velocity.begin();
    throw NumericError(detail::concat("NaN velocity at index ", first, " (", nan_count, " of ", n,
                                      " elements): cannot rank magnitudes"));
  }
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                   std::greater<float>());
  const float threshold = magnitudes[k - 1];
  // Of the k largest, how many are strictly above the threshold; the rest are ties taken by
  // lower index.
  size_t above = 0;
  for (size_t i = 0; i + 1 < k; ++i) above += magnitudes[i] > threshold;
  size_t ties = k - above;
  magnitudes = {};
  out.indices.reserve(k);
  out.values.reserve(k);
  for (size_t i = 0; i < n && out.indices.size() < k; ++i) {
    const float magnitude = std::fabs(velocity[i]);
    if (magnitude < threshold) continue;
    if (magnitude == threshold) {
      if (ties == 0) continue;
      --ties;
    }
    out.indices.push_back(static_cast<uint32_t>(i));
    out.values.push_back(velocity[i]);
  }
  out.threshold = threshold;
}

}  // namespace detail
}  // namespace dgc
