// Small statistics shared by the benchmark subcommands.
#pragma once

#include <algorithm>
#include <vector>

#include "dgc/core/error.h"

namespace dgc::cli {

// Median of `values` (the mean of the two middle ones for an even count). Throws
// dgc::InvalidArgument for no values.
inline double median(std::vector<double> values) {
  DGC_CHECK(!values.empty(), "median of no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace dgc::cli
