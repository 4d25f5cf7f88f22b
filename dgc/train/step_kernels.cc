#include "dgc/train/step_kernels.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dgc/core/error.h"

namespace dgc::train::kernels {
namespace {

// Exponent bits all ones: NaN or infinity.
constexpr uint32_t kExponent = 0x7f800000u;
// Copies of at least this many elements stream (copy_finite).
constexpr size_t kStreamingCopy = size_t{1} << 16;

template <bool kNesterov>
void dense_direction_loop(const float* __restrict avg, const float* __restrict w,
                          float* __restrict u, float* __restrict out, size_t n, float m, float wd) {
  for (size_t e = 0; e < n; ++e) {
    const float g = avg[e] + wd * w[e];
    u[e] = m * u[e] + g;
    out[e] = kNesterov ? g + m * u[e] : u[e];
  }
}

template <bool kNesterov>
void dense_apply_loop(const float* __restrict avg, float* __restrict w, float* __restrict u,
                      size_t n, float m, float wd, float lr) {
  for (size_t e = 0; e < n; ++e) {
    const float g = avg[e] + wd * w[e];
    const float uu = m * u[e] + g;
    u[e] = uu;
    const float d = kNesterov ? g + m * uu : uu;
    w[e] = w[e] - lr * d;
  }
}

template <bool kNesterov>
void compressed_direction_loop(const float* __restrict w, const float* __restrict update,
                               float* __restrict b, float* __restrict out, size_t n, float m,
                               float wd) {
  for (size_t e = 0; e < n; ++e) {
    const float decay = wd * w[e];
    b[e] = m * b[e] + decay;
    out[e] = (kNesterov ? decay + m * b[e] : b[e]) + update[e];
  }
}

template <bool kNesterov>
void apply_decay_loop(float* __restrict w, float* __restrict b, size_t n, float m, float wd,
                      float lr) {
  for (size_t e = 0; e < n; ++e) {
    const float decay = wd * w[e];
    const float bb = m * b[e] + decay;
    b[e] = bb;
    // + 0.0f: the update there is +0, and b + 0 is not b when b is -0.
    const float d = (kNesterov ? decay + m * bb : bb) + 0.0f;
    w[e] = w[e] - lr * d;
  }
}

}  // namespace

bool copy_finite(const float* __restrict in, float* __restrict out, size_t n) {
  uint32_t bad = 0;  // 1 once an element was NaN or infinite
  size_t e = 0;
#if defined(__SSE2__)
  // Long copies with streaming stores: the buffer written is not read first (ordinary stores
  // would read every line of it from memory), and it is far larger than the caches anyway.
  if (n >= kStreamingCopy) {
    for (; e < n && reinterpret_cast<uintptr_t>(out + e) % 16 != 0; ++e) {
      uint32_t bits;
      std::memcpy(&bits, in + e, sizeof bits);
      out[e] = in[e];
      bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    }
    const __m128i exponent = _mm_set1_epi32(static_cast<int>(kExponent));
    __m128i all_ones = _mm_setzero_si128();
    for (; e + 4 <= n; e += 4) {
      const __m128 x = _mm_loadu_ps(in + e);
      _mm_stream_ps(out + e, x);
      const __m128i bits = _mm_and_si128(_mm_castps_si128(x), exponent);
      all_ones = _mm_or_si128(all_ones, _mm_cmpeq_epi32(bits, exponent));
    }
    _mm_sfence();
    bad |= static_cast<uint32_t>(_mm_movemask_epi8(all_ones) != 0);
  }
#endif
  for (; e < n; ++e) {
    uint32_t bits;
    std::memcpy(&bits, in + e, sizeof bits);
    out[e] = in[e];
    bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return bad == 0;
}

void dense_direction(const float* avg, const float* w, float* u, float* out, size_t n,
                     const DirectionFactors& f) {
  if (f.nesterov) {
    dense_direction_loop<true>(avg, w, u, out, n, f.m, f.wd);
  } else {
    dense_direction_loop<false>(avg, w, u, out, n, f.m, f.wd);
  }
}

void dense_apply(const float* avg, float* w, float* u, size_t n, const DirectionFactors& f) {
  if (f.nesterov) {
    dense_apply_loop<true>(avg, w, u, n, f.m, f.wd, f.lr);
  } else {
    dense_apply_loop<false>(avg, w, u, n, f.m, f.wd, f.lr);
  }
}

void compressed_direction(const float* w, const float* update, float* b, float* out, size_t n,
                          const DirectionFactors& f) {
  if (f.wd == 0.0f) {
    std::copy_n(update, n, out);
  } else if (f.nesterov) {
    compressed_direction_loop<true>(w, update, b, out, n, f.m, f.wd);
  } else {
    compressed_direction_loop<false>(w, update, b, out, n, f.m, f.wd);
  }
}

void SparseApply::save(std::span<const uint64_t> positions, std::span<const Segment> segments) {
  for (const uint64_t p : positions) {
    // The last segment that begins at or before p.
    auto it = std::upper_bound(segments.begin(), segments.end(), p,
                               [](uint64_t at, const Segment& s) { return at < s.begin; });
    DGC_CHECK(it != segments.begin(), "position ", p, " precedes the first tensor");
    const Segment& s = *(it - 1);
    DGC_CHECK_LT(p - s.begin, uint64_t{s.n}, "position outside every tensor");
    const size_t e = static_cast<size_t>(p - s.begin);
    saved_.push_back({p, s.w + e, s.b == nullptr ? nullptr : s.b + e, s.w[e]});
  }
}

void SparseApply::apply_decay(float* w, float* b, size_t n, const DirectionFactors& f) {
  if (f.nesterov) {
    apply_decay_loop<true>(w, b, n, f.m, f.wd, f.lr);
  } else {
    apply_decay_loop<false>(w, b, n, f.m, f.wd, f.lr);
  }
}

void SparseApply::finish(const float* update, const DirectionFactors& f) {
  for (const Saved& s : saved_) {
    float d = update[s.position];
    if (f.wd != 0.0f) {
      const float decay = f.wd * s.value;
      d = (f.nesterov ? decay + f.m * *s.b : *s.b) + d;
    }
    *s.w = s.value - f.lr * d;
  }
  saved_.clear();
}

}  // namespace dgc::train::kernels
