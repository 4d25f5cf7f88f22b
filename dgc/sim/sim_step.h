// One configuration of the simulated cluster (dgc-sim): complete data-parallel steps of a replay
// model, dense or with DGC and one exchange algorithm, on every rank of an SMPI simulation.
// Collective: every rank calls run_configuration with the same arguments.
//
// A step, per rank, in simulated time (MPI_Wtime under SMPI):
//   1. compute:  the forward and backward pass, a stated time (smpi_execute: no CPU spent);
//   2. compress: the real dgc::Compressor (momentum correction, selection, masking) on every
//                compressed tensor of a synthetic gradient (synthetic.h), on the sampled ranks;
//                the other ranks are charged the sampled ranks' mean time of the untimed
//                warm-up steps (charged as in SMPI_SAMPLE_DELAY) and send their synthetic
//                selection;
//   3. exchange: the real dgc::Exchange (encode, the collectives over the MPI communicator,
//                validate, decode) on every rank; dense: one allreduce of the whole gradient;
//   4. update:   w -= lr * update over every element, sampled like compress.
// SMPI times the CPU work of steps 2-4 on this machine and charges it to the simulated host
// (the platform's host speed equals smpi/host-speed: 1 s of CPU here is 1 s simulated); the
// network is SimGrid's flow model of the platform file.
//
// Memory: on the ranks that are not sampled, buffers whose contents do not decide the result
// (the weights, the dense gradient, the update buffers) are SMPI shared allocations, one
// physical copy for all ranks, unless private_buffers; the sampled ranks own theirs, so that
// their update and decode touch memory as a real rank's do. The compressor's momentum and
// velocity and the gradients exist only on sampled ranks, and so does the exchange's record of
// the positions it wrote (ExchangeOptions::record_written). What every rank still holds for
// itself is what it receives: with allgather and direct, N messages (38 MB per rank for
// ResNet-50 at 256 ranks, 10 GB in all).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/names.h"
#include "dgc/train/model_shapes.h"

namespace dgc::sim {

struct SimOptions {
  std::string model = "resnet50";
  double compute_seconds = -1.0;  // < 0: default_compute_seconds() of the model
  double density = 0.001;
  double overlap = 0.0;  // cross-rank overlap of the synthetic selections (synthetic.h)
  int sample_ranks = 4;  // ranks that compress and update for real; 0: every rank
  int steps = 3;         // timed steps
  // Untimed steps before them; the last one calibrates what the other ranks are charged (the
  // first step of a compressor is slower: it has no threshold prediction yet).
  int warmup_steps = 2;
  bool private_buffers = false;  // every rank owns its weights, gradient and update buffers
  bool check = false;  // check every step's update against the reference (needs private_buffers)
  // A barrier between compression and the exchange, outside the exchange's time (as
  // `dgc bench exchange` has before each exchange): the exchange time then leaves out the wait
  // for ranks whose compression took longer. For checking against that benchmark.
  bool exchange_barrier = false;
  double lr = 0.1;
  uint64_t seed = 1;
};

struct SimResult {
  std::string algorithm;  // "dense" or an exchange algorithm
  // Medians over the timed steps of the slowest rank's times, seconds (simulated).
  double step = 0.0, compute = 0.0, compress = 0.0, exchange = 0.0, update = 0.0;
  // The slowest sampled rank's exchange (median over the timed steps): a rank whose CPU work is
  // all its own. The ranks that are not sampled decode into shared buffers, which some hosts
  // make far slower than a real rank's own memory (docs/scaling.md).
  double exchange_sampled = 0.0;
  // Of the exchange: rank 0's CPU parts (encode, validate, decode; the rest is wire and waiting).
  double exchange_cpu = 0.0;
  uint64_t message_bytes = 0, wire_sent = 0, wire_received = 0;  // rank 0, per step
  double overlap_measured = 0.0;  // fraction of rank 0's indices (all tensors) rank 1 selects too
  int sampled = 0;                // ranks that compressed for real
  int64_t check_mismatches = -1;  // -1: not checked
};

// algorithm: "dense", "allgather", "direct" or "sparse-allreduce".
SimResult run_configuration(comm::Communicator& comm, const std::vector<train::NamedShape>& shapes,
                            const std::string& algorithm, const SimOptions& options);

}  // namespace dgc::sim
