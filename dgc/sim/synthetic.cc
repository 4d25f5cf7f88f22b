#include "dgc/sim/synthetic.h"

#include <algorithm>
#include <cmath>

#include "dgc/core/error.h"
#include "dgc/core/selection.h"

namespace dgc::sim {
namespace {

// SplitMix64: a small, fast stream with good statistics, seeded by a hash of its key.
struct Stream {
  uint64_t state;
  // The key is mixed first: keys that differ by one must not give the same stream shifted.
  explicit Stream(uint64_t key) : state(key) { state = next(); }
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

uint64_t key(uint64_t seed, uint64_t tensor, uint64_t rank) {
  return (seed * 1000003ull + tensor) * 1000033ull + rank;
}

// Appends distinct indices drawn from `stream` until `out` holds `count` (sorted, unique).
void draw_distinct(Stream& stream, uint64_t numel, size_t count, std::vector<uint32_t>& out) {
  while (out.size() < count) {
    const size_t before = out.size();
    for (size_t i = before; i < count; ++i)
      out.push_back(static_cast<uint32_t>(stream.below(numel)));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

}  // namespace

std::vector<uint32_t> synthetic_indices(uint64_t numel, size_t tensor, int rank,
                                        const SyntheticOptions& options) {
  DGC_CHECK(options.overlap >= 0.0 && options.overlap <= 1.0, "overlap must be in [0, 1], got ",
            options.overlap);
  DGC_CHECK(numel > 0 && numel <= (uint64_t{1} << 32), "numel out of range: ", numel);
  const size_t k = target_count(numel, options.density);
  // overlap x k rounded up with the probability of its fraction, so that small tensors' k (a
  // ResNet-50 has many below 33) keep the stated overlap on average over the tensors instead of
  // rounding to none. The draw depends on the seed and the tensor only: every rank agrees.
  const double wanted = options.overlap * double(k);
  auto common_count = static_cast<size_t>(std::floor(wanted));
  Stream rounding(key(options.seed, tensor, ~uint64_t{1}));
  if (double(rounding.next() >> 11) * 0x1p-53 < wanted - double(common_count)) ++common_count;
  common_count = std::min(common_count, k);
  // The common pool: the first common_count draws of the tensor's stream, made distinct.
  std::vector<uint32_t> out;
  out.reserve(k);
  Stream common(key(options.seed, tensor, ~uint64_t{0}));
  draw_distinct(common, numel, common_count, out);
  Stream own(key(options.seed, tensor, static_cast<uint64_t>(rank)));
  draw_distinct(own, numel, k, out);
  return out;
}

void synthetic_gradient(std::span<float> grad, std::span<const uint32_t> indices, size_t tensor,
                        int rank, uint64_t seed, float noise) {
  Stream stream(key(seed ^ 0x5EED, tensor, static_cast<uint64_t>(rank)));
  const float scale = 2.0f * noise / 16777216.0f;
  for (float& g : grad) g = float(stream.next() >> 40) * scale - noise;
  for (uint32_t i : indices) {
    DGC_CHECK_LT(i, grad.size(), "index out of range");
    grad[i] = (stream.next() & 1) ? 1.0f : -1.0f;
  }
}

double shared_fraction(std::span<const uint32_t> a, std::span<const uint32_t> b) {
  if (a.empty()) return 0.0;
  size_t i = 0, j = 0, both = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++both, ++i, ++j;
    }
  }
  return double(both) / double(a.size());
}

}  // namespace dgc::sim
