#include "dgc/cli/bench_step_bounds.h"

#include <chrono>
#include <random>

#include "dgc/core/error.h"

namespace dgc::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The dense optimizer's streaming bound: one pass over g, u, w.
void dense_bound_pass(const float* __restrict g, float* __restrict u, float* __restrict w, size_t n,
                      float m, float wd, float lr) {
  for (size_t e = 0; e < n; ++e) {
    const float d = g[e] + wd * w[e];
    const float uu = m * u[e] + d;
    u[e] = uu;
    w[e] = w[e] - lr * uu;
  }
}

}  // namespace

StepBounds::StepBounds(int64_t numel, double density, const CompressionOptions& options,
                       int variants, uint64_t seed)
    : density_(density),
      compressor_({numel}, options),
      u_(static_cast<size_t>(numel), 0.0f),
      w_(static_cast<size_t>(numel), 0.01f) {
  DGC_CHECK_GE(variants, 1, "gradient variants");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.01f, 0.01f);
  grads_.assign(static_cast<size_t>(variants), std::vector<float>(static_cast<size_t>(numel)));
  for (auto& g : grads_) {
    for (float& x : g) x = uniform(rng);
  }
}

const std::vector<float>& StepBounds::gradient(int step) const {
  return grads_[static_cast<size_t>(step) % grads_.size()];
}

double StepBounds::core_step(int step) {
  const auto start = Clock::now();
  compressor_.step(0, gradient(step), density_, selection_);
  return seconds_since(start);
}

double StepBounds::dense_bound(int step) {
  const auto start = Clock::now();
  dense_bound_pass(gradient(step).data(), u_.data(), w_.data(), u_.size(), 0.9f, 1e-4f, 0.1f);
  return seconds_since(start);
}

}  // namespace dgc::cli
