// The fused pass of a DGC step (kernels.h): the momentum update and the threshold test in one
// pass over the velocity, split into parts that run on a thread pool.
#include <algorithm>
#include <cmath>
#include <optional>

#include "dgc/core/error.h"
#include "dgc/core/kernels.h"
#include "dgc/core/thread_pool.h"

namespace dgc::detail {
namespace {

struct PartOutput {
  std::vector<uint32_t>& indices;
  std::vector<float>& values;
  std::vector<uint32_t>& nonfinite;
  uint8_t& overflowed;
  size_t cap;
};

// One element's update, in place (su, sv unused) or out of place (from su, sv into u, v).
template <Update kUpdate, bool kOutOfPlace>
inline float update_at(float* __restrict u, float* __restrict v, const float* __restrict su,
                       const float* __restrict sv, const float* __restrict g, float m, size_t i) {
  if constexpr (kOutOfPlace) {
    float uu = su[i];
    float vv = sv[i];
    const float vi = update_one<kUpdate>(uu, vv, g[i], m);
    u[i] = uu;
    v[i] = vv;
    return vi;
  } else {
    return update_one<kUpdate>(u[i], v[i], g[i], m);
  }
}

// Updates (if kUpdate) and counts !(|v| < threshold) over `size` elements: NaN counts too.
// With a compile-time `size` the loop vectorises without a remainder.
template <Update kUpdate, size_t kSize, bool kOutOfPlace = false>
inline uint32_t update_and_count(float* __restrict u, float* __restrict v,
                                 const float* __restrict su, const float* __restrict sv,
                                 const float* __restrict g, float m, float threshold) {
  uint32_t count = 0;
  for (size_t i = 0; i < kSize; ++i) {
    float vi;
    if constexpr (kUpdate == Update::kNone) {
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

template <Update kUpdate, bool kOutOfPlace = false>
void pass_range(const PassTarget& t, size_t begin, size_t end, float threshold,
                const SampleSpec* sample, PartOutput out) {
  constexpr size_t kSub = kSubBlock;
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
        kUpdate == Update::kNone ? nullptr : u + block, v + block,
        kOutOfPlace ? su + block : nullptr, kOutOfPlace ? sv + block : nullptr,
        kUpdate == Update::kNone ? nullptr : g + block, m, threshold);
    take_sample(block + kBlock);
    if (count == 0) continue;
    // Narrow down to the sub-blocks with a hit (the block is in L1), then gather.
    for (size_t sub = block; sub < block + kBlock; sub += kSub) {
      if (update_and_count<Update::kNone, kSub>(nullptr, v + sub, nullptr, nullptr, nullptr, m,
                                                threshold)) {
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
    if constexpr (kUpdate != Update::kNone) update_at<kUpdate, kOutOfPlace>(u, v, su, sv, g, m, i);
  }
  take_sample(end);
  gather(v, block, end, threshold, out);
}

void pass_part(const PassTarget& t, size_t begin, size_t end, float threshold,
               const SampleSpec* sample, PartOutput out) {
  out.indices.clear();
  out.values.clear();
  out.nonfinite.clear();
  out.overflowed = 0;
  const bool out_of_place = t.source_velocity != nullptr;
  switch (t.update) {
    case Update::kNone:
      return pass_range<Update::kNone>(t, begin, end, threshold, sample, out);
    case Update::kPlain:
      return out_of_place ? pass_range<Update::kPlain, true>(t, begin, end, threshold, sample, out)
                          : pass_range<Update::kPlain>(t, begin, end, threshold, sample, out);
    case Update::kNesterov:
      return out_of_place
                 ? pass_range<Update::kNesterov, true>(t, begin, end, threshold, sample, out)
                 : pass_range<Update::kNesterov>(t, begin, end, threshold, sample, out);
  }
}

size_t part_begin(size_t part, size_t parts, size_t size) {
  if (part == 0) return 0;
  if (part >= parts) return size;
  const size_t begin = (part * size / parts) / kBlock * kBlock;
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

}  // namespace

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

void gather_sample(const PassTarget& t, const SampleSpec& spec, size_t parts, ThreadPool* pool) {
  const size_t sample_parts = std::min(parts, std::max<size_t>(1, spec.count / 4096));
  for_each_part(sample_parts, spec.count, pool, [&](size_t, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float magnitude = std::fabs(t.velocity[spec.start + i * spec.stride]);
      spec.out[i] = std::isfinite(magnitude) ? magnitude : 0.0f;
    }
  });
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
  throw NumericError(
      concat("non-finite velocity (", found, ") at index ", *first, ", ", count, " of ",
             target.size, " elements: the gradient or the accumulated state holds NaN or infinity",
             reset_state ? "; momentum and velocity at those elements were reset to zero" : ""));
}

}  // namespace dgc::detail
