#include "dgc/cli/bench_step_bounds.h"

#include <chrono>
#include <random>
#include <vector>

#include "dgc/cli/statistics.h"
#include "dgc/core/compressor.h"
#include "dgc/core/error.h"

namespace dgc::cli {
namespace {

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

StepBounds measure_step_bounds(int64_t numel, double density, const CompressionOptions& options,
                               int variants, int untimed, int steps, uint64_t seed) {
  DGC_CHECK_GE(numel, 1, "elements");
  DGC_CHECK_GE(variants, 1, "gradient variants");
  DGC_CHECK_GE(steps, 1, "timed steps");
  const auto n = static_cast<size_t>(numel);
  std::vector<std::vector<float>> grads(static_cast<size_t>(variants), std::vector<float>(n));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.01f, 0.01f);
  for (auto& g : grads) {
    for (float& x : g) x = uniform(rng);
  }
  using Clock = std::chrono::steady_clock;
  const auto time = [&](const auto& pass) {
    std::vector<double> seconds;
    for (int s = 0; s < untimed + steps; ++s) {
      const auto start = Clock::now();
      pass(grads[static_cast<size_t>(s % variants)]);
      if (s >= untimed) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    return median(seconds);
  };

  StepBounds bounds;
  {
    Compressor compressor({numel}, options);
    Selection selection;
    bounds.core_step =
        time([&](const std::vector<float>& g) { compressor.step(0, g, density, selection); });
  }
  std::vector<float> u(n, 0.0f), w(n, 0.01f);
  bounds.dense_bound = time([&](const std::vector<float>& g) {
    dense_bound_pass(g.data(), u.data(), w.data(), n, 0.9f, 1e-4f, 0.1f);
  });
  return bounds;
}

}  // namespace dgc::cli
