// dgc bench exchange (bench_exchange.cc, which describes what is measured): its options and
// result, the workload every rank can regenerate (bench_exchange_check.cc, with the reference
// check of what the exchange returned), and the report (bench_exchange_report.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/selection.h"

namespace dgc::cli::bench_exchange {

struct BenchExchangeOptions {
  // "auto" (mpi under mpirun, gloo otherwise), "gloo" or "mpi".
  std::string backend = "auto";
  std::string rendezvous;  // Gloo under a launcher: shared directory instead of the TCP store
  // Worker threads in local mode. In multi-process mode the world size comes from the launcher
  // (0 here: take it; otherwise it must match).
  int workers = 0;
  int64_t numel = 25'557'032;  // elements of the compressed tensor (ResNet-50's parameter count)
  int64_t dense_numel = 0;     // elements of the dense-path part (0: none)
  double density = 0.001;      // d: fraction of the compressed tensor each rank sends
  std::string value_type = "fp32";  // wire type of the values: fp32 | fp16 | bf16
  int repeats = 20;                 // timed DGC exchange iterations
  int untimed_iterations = 2;       // untimed DGC exchange iterations before them
  int dense_repeats = 3;            // timed dense allreduces (after one untimed)
  // Distinct gradients per rank, used in turn by the iterations, so that consecutive iterations
  // select different positions as in training (a repeated selection would find the positions it
  // writes in cache). Gradient 0 also feeds the dense baseline and the dense-path part.
  int gradients = 4;
  uint64_t seed = 1;                   // seeds the gradients and the sampling
  double bandwidth_gbit = 0.0;         // > 0: report wire-time bounds at this link rate
  std::string hostname;                // Gloo: address to bind (empty: from the rendezvous)
  double timeout_seconds = 120.0;      // per collective and for rendezvous
  bool json = false;                   // one JSON object per line instead of a table
  std::string exchange = "allgather";  // allgather | direct | sparse-allreduce | auto
};

// The Exchange's phases (ExchangeTimings): per iteration the slowest rank's, median over
// iterations.
struct Phases {
  double encode = 0.0;
  double collective = 0.0;
  double validate = 0.0;
  double decode = 0.0;
};

// Everything rank 0 prints; computed collectively, so identical on every rank.
struct Result {
  std::string backend;
  std::string launch;
  int workers = 0;
  int64_t numel = 0;
  int64_t dense_numel = 0;
  double density = 0.0;
  std::string value_type;
  std::string exchange;            // as requested (--exchange)
  std::string algorithm;           // what the exchange runs (auto resolved)
  uint64_t selected_per_rank = 0;  // max over ranks
  uint64_t applied = 0;            // elements added into the update in the last iteration (max)
  uint64_t returned_per_rank = 0;  // elements handed back to a rank in the last iteration (max)
  int repeats = 0;
  int dense_repeats = 0;
  int gradients = 0;
  double select_seconds = 0.0;  // slowest rank's selection time
  double dgc_seconds = 0.0;
  double dgc_seconds_min = 0.0;
  double dense_seconds = 0.0;
  double dense_seconds_min = 0.0;
  uint64_t message_bytes = 0;             // max over ranks: encoded message + dense-path floats
  uint64_t dense_gradient_bytes = 0;      // 4 x every element
  uint64_t wire_bytes_sent_per_rank = 0;  // DGC wire bytes sent, max over ranks, per iteration
  uint64_t wire_bytes_received_per_rank = 0;
  uint64_t busiest_link_bytes = 0;         // max over ranks and directions (star network)
  uint64_t dense_wire_bytes_per_rank = 0;  // the dense allreduce's wire bytes sent, max
  uint64_t dense_busiest_link_bytes = 0;
  bool verified = false;
  bool dense_verified = false;
  int64_t mismatches = 0;     // summed over ranks (DGC and dense)
  std::string first_problem;  // rank 0's first verification problem, if any
  Phases phases;
};

// Rank `rank`'s gradient number `variant` (see BenchExchangeOptions::gradients): uniform in
// [-1, 1) on a 2^-23 grid, a pure function of (seed, rank, variant, index).
void fill_gradient(uint64_t seed, int rank, int variant, std::span<float> out);

// The selection rank `rank` makes on its gradient `variant` (a pure function of seed, rank and
// variant).
void select_for_rank(const BenchExchangeOptions& o, int rank, int variant,
                     std::span<const float> gradient, Selection& out);

// Checks this rank's exchange output with the reference (dgc::check_update): every rank's
// selection regenerated from the seeds, every rank's `unapplied` as gathered. The dense-path part
// against the directly computed average. Returns the number of mismatches.
int64_t verify_exchange(const BenchExchangeOptions& o, int world_size, int my_rank, int variant,
                        const Selection& my_selection, std::span<const Selection> unapplied,
                        std::span<const float> update, std::span<const float> dense_part,
                        std::span<float> scratch, std::string& first_problem);

// Every rank's `unapplied` (one tensor) through the communicator: u32 indices then f32 values.
std::vector<Selection> gather_unapplied(comm::Communicator& comm, const Selection& mine,
                                        comm::Timeout timeout);

// Checks the dense allreduce result against the directly computed sum. Returns mismatches.
int64_t verify_dense(const BenchExchangeOptions& o, int world_size, std::span<const float> summed);

// Prints the result as a table, or as JSON lines with o.json.
void print_result(const Result& r, const BenchExchangeOptions& o);

}  // namespace dgc::cli::bench_exchange
