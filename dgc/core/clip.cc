#include "dgc/core/clip.h"

#include <cmath>

#include "dgc/core/error.h"

namespace dgc {

double squared_norm(std::span<const float> values) {
  // Four independent accumulators: the additions pipeline instead of waiting on each other.
  double sums[4] = {0.0, 0.0, 0.0, 0.0};
  const size_t n = values.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int lane = 0; lane < 4; ++lane) {
      const double x = values[i + lane];
      sums[lane] += x * x;
    }
  }
  for (; i < n; ++i) {
    const double x = values[i];
    sums[0] += x * x;
  }
  return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

std::string to_string(ClipScaling scaling) { return name_of(kClipScalingNames, scaling); }

ClipScaling parse_clip_scaling(const std::string& name) {
  return parse_name(kClipScalingNames, name, "clip scaling");
}

double local_clip_limit(double max_norm, int world_size, ClipScaling scaling) {
  DGC_CHECK_GE(world_size, 1, "world size must be at least 1");
  if (!(max_norm > 0.0)) return 0.0;
  const double root = std::sqrt(static_cast<double>(world_size));
  return scaling == ClipScaling::kPaper ? max_norm * root : max_norm / root;
}

double clip_coefficient(double total_squared_norm, double limit) {
  if (!std::isfinite(total_squared_norm)) {
    throw NumericError(detail::concat("gradient norm is not finite (squared norm ",
                                      total_squared_norm, "): a gradient holds NaN or infinity"));
  }
  DGC_CHECK_GE(total_squared_norm, 0.0, "a squared norm cannot be negative");
  if (!(limit > 0.0)) return 1.0;
  const double norm = std::sqrt(total_squared_norm);
  return norm > limit ? limit / norm : 1.0;
}

void scale(std::span<float> values, float coefficient) {
  for (float& x : values) x *= coefficient;
}

}  // namespace dgc
