// What `dgc bench step` compares the optimizer step's own work with, measured in the same process
// on buffers of the model's parameter count (one rank, the calling thread):
//   core_step:   the core's fused DGC step, Compressor::step in place on one tensor of all the
//                elements (momentum correction, sampled selection, masking) at the step's
//                density and compressor settings;
//   dense_bound: one pass of momentum SGD with weight decay, g' = g + wd*w; u = m*u + g';
//                w -= lr*u, which reads g, u and w and writes u and w once: the least the dense
//                optimizer's own work can cost (its streaming bound).
// Gradients: `variants` buffers uniform in [-0.01, 0.01) (as the step's), used in turn. Each
// figure is the median of `steps` timed passes after `untimed` untimed ones.
#pragma once

#include <cstdint>

#include "dgc/core/options.h"

namespace dgc::cli {

struct StepBounds {
  double core_step = 0.0;    // seconds
  double dense_bound = 0.0;  // seconds
};

StepBounds measure_step_bounds(int64_t numel, double density, const CompressionOptions& options,
                               int variants, int untimed, int steps, uint64_t seed);

}  // namespace dgc::cli
