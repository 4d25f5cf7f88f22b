// `--exchange auto` with a stated link (`dgc train --link`): the exchange algorithm the cost model
// of `dgc plan` (dgc/sim/cost_model.h, fitted to the simulated cluster of docs/scaling.md)
// predicts fastest for this model, number of workers, density and link. Without a link, auto keeps
// the size rule of dgc/exchange/algorithm.h (choose_algorithm). Pure; every rank computes the same
// choice from the same inputs (the handshake compares the resulting setting).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "dgc/exchange/algorithm.h"
#include "dgc/sim/cost_model.h"
#include "dgc/train/model_shapes.h"

namespace dgc::train {

struct ExchangeChoice {
  ExchangeAlgorithm algorithm = ExchangeAlgorithm::kAllgather;
  // Predicted exchange seconds per sim::kPlannedAlgorithms entry.
  std::array<double, 3> seconds = {};
  // One line for the start-up output, e.g. "exchange auto: direct for 4 workers at 1 Gbit/s,
  // 0.05 ms: predicted allgather 2.9 ms, direct 2.3 ms, sparse-allreduce 4.1 ms (dgc plan's
  // cost model)".
  std::string text;
};

// The link of `--link`: a platform name of bench/platforms (sim::platform_names()) or
// "RATE_MBIT[:LATENCY_MS]" (one way, host to host; default latency 0.05 ms). Throws
// dgc::InvalidArgument naming the accepted forms.
sim::Link parse_link(const std::string& text);

// A stated link this slow to answer (one way, host to host; the mobile platforms' 20 ms) makes the
// pipelined step (`--pipeline 1`) dgc train's default: there the exchange's round trips, not its
// bytes, set the step, and the pipelined step keeps every task's accuracy (docs/results.md).
inline constexpr double kPipelineLatencySeconds = 0.005;
inline bool pipelined_by_default(const sim::Link& link) {
  return link.latency_seconds >= kPipelineLatencySeconds;
}

// The fastest predicted exchange; ties go to the earlier of allgather, direct, sparse-allreduce.
ExchangeChoice choose_exchange_for_link(const std::vector<NamedShape>& shapes, int workers,
                                        double density, const sim::Link& link);

}  // namespace dgc::train
