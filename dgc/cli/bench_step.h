// dgc bench step (bench_step.cc, which describes what is measured): its options, what one
// configuration measures, and the report (bench_step_report.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dgc/exchange/exchange.h"

namespace dgc::cli::bench_step {

struct BenchStepOptions {
  std::vector<std::string> models = {"resnet50"};
  double compute_seconds = -1.0;  // < 0: the model's default
  int workers = 0;                // local threads (0: 4); under a launcher: must match if given
  int steps = 5;
  int untimed_iterations = 1;
  int variants = 2;
  double density = 0.001;
  std::string link = "loopback";  // label for the output
  double bandwidth_gbit = 0.0;    // > 0: report the wire time at this rate
  std::string hostname;
  double timeout_seconds = 300.0;
  uint64_t seed = 1;
  bool skip_single = false;  // skip the one-rank baseline (scaling efficiency not reported)
  bool json = false;
  // Replay the backward pass: the gradients in backward order over the compute time (in
  // proportion to each layer's forward FLOPs), the step's buckets overlapped with it.
  bool replay = false;
  double bucket_cap_mb = 25.0;      // with replay: the overlapped runs' bucket cap
  double last_bucket_cap_mb = 1.0;  // and the size of their last bucket (0: as the cap gives it)
};

struct Measured {
  // Median of the slowest rank's optimizer step; with replay, from the start of the replayed
  // backward pass to the end of the step (the compute included).
  double step = 0.0;
  double compress = 0.0;  // medians of the slowest rank's parts (summed over the buckets)
  double exchange = 0.0;
  double update = 0.0;
  double wait = 0.0;  // what step() waited for buckets still in flight after the backward pass
  // Rank 0, without replay: the median of its bound (bench_step_bounds.h: the core's fused step
  // for DGC, the streaming bound for dense), one pass after each step; 0 when not measured.
  double bound = 0.0;
  size_t buckets = 1;
  // The last step's bytes on this rank (rank 0's in the output; the collectives are symmetric
  // across ranks).
  ExchangeBytes bytes;
};

struct Row {
  std::string model;
  int64_t parameters = 0;
  int workers = 0;
  double compute = 0.0;
  bool compute_default = false;
  Measured dense, dgc;  // with replay: overlapped in buckets
  std::optional<Measured> dense_single, dgc_single;
  // With replay: the same replay, one message after the backward pass.
  std::optional<Measured> dense_one_message, dgc_one_message;
};

// Rank 0's report of one row: a JSON line or text.
void print(const Row& r, const BenchStepOptions& o);

}  // namespace dgc::cli::bench_step
