// The entry points of selection.h, the range checks of its options, and the exact top-k. The
// sampled selection is in sampled_selection.cc, the fused pass it runs in fused_pass.cc.
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
