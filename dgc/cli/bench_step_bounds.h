// What `dgc bench step` compares the optimizer step's own work with, on buffers of the model's
// parameter count in the same process (one rank, the calling thread), timed between the steps so
// that both see the same load:
//   core_step:   the core's fused DGC step, Compressor::step in place on one tensor of all the
//                elements (momentum correction, sampled selection, masking) at the step's
//                density and compressor settings;
//   dense_bound: one pass of momentum SGD with weight decay, g' = g + wd*w; u = m*u + g';
//                w -= lr*u, which reads g, u and w and writes u and w once: the least the dense
//                optimizer's own work can cost (its streaming bound).
// Gradients: `variants` buffers uniform in [-0.01, 0.01) (as the step's), used in turn.
#pragma once

#include <cstdint>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/core/options.h"

namespace dgc::cli {

class StepBounds {
 public:
  StepBounds(int64_t numel, double density, const CompressionOptions& options, int variants,
             uint64_t seed);
  // One pass on gradient variant `step` % variants; its wall time in seconds.
  double core_step(int step);
  double dense_bound(int step);

 private:
  const std::vector<float>& gradient(int step) const;

  double density_;
  std::vector<std::vector<float>> grads_;
  Compressor compressor_;
  Selection selection_;
  std::vector<float> u_, w_;  // the dense bound's momentum and weights
};

}  // namespace dgc::cli
