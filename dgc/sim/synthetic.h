// Synthetic selections and gradients for the simulated cluster (dgc-sim): what each rank selects
// in each compressed tensor, with a stated overlap across ranks. Plain C++: no MPI.
//
// Rank r's selection in a tensor of n elements at density d has k = target_count(n, d) distinct
// indices (sorted): overlap * k of them (rounded up or down at random with the odds of its
// fraction, the same draw on every rank, so that tensors with a small k keep the overlap on
// average) are the first indices of a pool common to every rank (a function of the seed and the
// tensor), the rest are drawn uniformly from the rank's own stream (seed, tensor, rank), so they
// meet other ranks' only by chance, as independent selections do. overlap = 0 is the independent
// (worst) case for allgather's decode work and for sparse-allreduce's volume; overlap = 1 makes
// every rank select the same positions.
//
// A gradient with that selection: uniform noise in [-noise, noise) and a spike of magnitude 1 at
// every selected index (random sign), so that the compressor's top-k of its first steps is the
// spikes. Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dgc::sim {

struct SyntheticOptions {
  double density = 0.001;
  double overlap = 0.0;  // in [0, 1]
  uint64_t seed = 1;
};

// Sorted distinct indices in [0, numel).
std::vector<uint32_t> synthetic_indices(uint64_t numel, size_t tensor, int rank,
                                        const SyntheticOptions& options);

// Writes the gradient with spikes at `indices` into `grad` (size numel).
void synthetic_gradient(std::span<float> grad, std::span<const uint32_t> indices, size_t tensor,
                        int rank, uint64_t seed, float noise = 1e-3f);

// The fraction of a's indices that b also holds (both sorted).
double shared_fraction(std::span<const uint32_t> a, std::span<const uint32_t> b);

}  // namespace dgc::sim
