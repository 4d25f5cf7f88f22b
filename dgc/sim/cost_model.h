// The cost model of a data-parallel SGD step, dense and with DGC over each exchange algorithm,
// on N nodes joined by one switch: what `dgc plan` prints. Its constants were fitted to the
// simulated cluster (dgc-sim, docs/scaling.md); `dgc plan --fit` refits them from dgc-sim's JSON
// lines and reports how well the model reproduces each simulated step. Pure functions;
// thread-safe.
//
// A step (seconds), with P parameters of which Pc are compressed and Pd travel on the dense path,
// k = elements selected per step (density x Pc, per tensor rounded up), N nodes, a link of B
// bytes/s (the line rate x kWireEfficiency) and L seconds one way host to host:
//   dense    = compute + update_per_element * P + ring(4 P)
//   DGC      = compute + compress_per_element * Pc + update_per_element * P + ring(4 Pd)
//              + exchange(algorithm)                      (one node: DGC still compresses)
//   ring(S)  = allreduce_factor * (2 (N-1)/N * S / B + 2 (N-1) L)   (a ring allreduce; the
//              factor is what Open MPI's algorithms in the simulator take beyond it)
// and, with M = bytes_per_element * k (one rank's message):
//   allgather        (N-1) M / B + (N-1) L + decode_per_element * (N-1) k   (a ring of N-1 steps)
//   direct           (N-1) M / B + 2 L     + decode_per_element * (N-1) k   (all at once)
//   sparse-allreduce sparse_volume * M / B + 4 L + sparse_cpu_per_element * k * log2(N)
// (sparse-allreduce: split-and-reduce, every rank receives about sparse_volume messages' worth
// whatever N, in four rounds.) One node: no exchange at all. The speedup over one node is
// N x (one node's dense step) / step.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dgc/exchange/algorithm.h"
#include "dgc/train/model_shapes.h"

namespace dgc::sim {

// Goodput of TCP/IP over Ethernet as a fraction of the line rate (1448 payload bytes in a
// 1538-byte frame slot with preamble and gap: 0.94; the platforms use 0.97, SimGrid's).
inline constexpr double kWireEfficiency = 0.97;

struct Link {
  double bits_per_second = 1e9;
  double latency_seconds = 50e-6;  // one way, host to host
};

// A named platform of bench/platforms (host to host: two links), or throws dgc::InvalidArgument.
Link platform_link(const std::string& name);
const std::vector<std::string>& platform_names();
// "1 Gbit/s", "20 Mbit/s": a link rate for output.
std::string rate_text(double bits_per_second);

// What the model needs to know of a model's tensors.
struct ModelSize {
  int64_t parameters = 0;  // P
  int64_t compressed = 0;  // Pc (the default policy: tensors of 2+ dimensions, >= 1024 elements)
  int64_t dense_path = 0;  // Pd
  int64_t selected = 0;    // k at the density
};
ModelSize model_size(const std::vector<train::NamedShape>& shapes, double density);

// Fitted constants (seconds per element, bytes per element, messages).
struct CostConstants {
  double allreduce_factor = 1.0;
  double compress_per_element = 0.0;
  double update_per_element = 0.0;
  double bytes_per_element = 0.0;
  double decode_per_element = 0.0;
  double sparse_volume = 0.0;
  double sparse_cpu_per_element = 0.0;
};
// The constants fitted to the simulations of docs/scaling.md (see cost_model.cc).
const CostConstants& fitted_constants();

inline constexpr std::array<ExchangeAlgorithm, 3> kPlannedAlgorithms = {
    ExchangeAlgorithm::kAllgather, ExchangeAlgorithm::kDirect, ExchangeAlgorithm::kSparseAllreduce};

struct Prediction {
  double dense = 0.0;              // step seconds
  std::array<double, 3> dgc = {};  // step seconds per kPlannedAlgorithms entry
  double single_node = 0.0;        // one node, dense: compute + update
  ExchangeAlgorithm best = ExchangeAlgorithm::kAllgather;  // fastest DGC exchange
  double best_dgc() const;
  bool compress() const { return best_dgc() < dense; }  // the verdict
  // Speedup over one node: N x single_node / step.
  double dense_speedup(int nodes) const { return nodes * single_node / dense; }
  double dgc_speedup(int nodes) const { return nodes * single_node / best_dgc(); }
};

Prediction predict(const ModelSize& model, int nodes, const Link& link, double compute_seconds,
                   const CostConstants& constants = fitted_constants());

// The exchange part alone (seconds) of one algorithm, and of the dense allreduce.
double exchange_seconds(const ModelSize& model, int nodes, const Link& link,
                        ExchangeAlgorithm algorithm, const CostConstants& constants);
double dense_allreduce_seconds(int64_t elements, int nodes, const Link& link,
                               const CostConstants& constants);

}  // namespace dgc::sim
