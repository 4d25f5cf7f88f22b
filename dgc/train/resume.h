// `--resume auto`: resume if there is something to resume, at the world size the launcher gives.
//
// The same command line serves the first attempt of a job and every restart (torchrun's
// --max_restarts, an elastic --nnodes MIN:MAX job that lost or gained a node): with no checkpoint
// of any rank under the prefix the run starts fresh; otherwise it continues from the newest set of
// files that is complete, i.e. that every rank of the run which wrote it has a file of.
//
// Same world size as the set: the ordinary resume (trainer.h) from that step, bit for bit the run
// that was not interrupted.
//
// Another world size (an elastic restart): the set's state is handed over to the new ranks
// (rescale_checkpoint), which needs every old rank's file readable by the new ranks (a shared
// checkpoint path; each rank reads the files of the old ranks it inherits). What is decided, and
// why (docs/reliability.md, "Elastic restarts"):
//   - weights, model buffers, the dense tensors' momenta and the weight-decay momenta are the
//     same on every rank: taken as they are;
//   - per-rank DGC state (each compressed tensor's momentum u and velocity v, the 16-bit dense
//     path's rounding residual): old rank r's state goes to new rank r mod W' (a joining rank,
//     r >= W_old, starts with zero), and every new rank's sum is scaled by W'/W_old. The exchange
//     divides the sum over ranks by the world size, so this keeps sum(v)/W and sum(u)/W, the
//     update still owed and the momentum the run carries, exactly what they were: a lost rank's
//     residual is sent later by the rank that inherited it, not dropped;
//   - the position: the epoch stays, the examples already consumed in it stay consumed (the new
//     iteration in the epoch is floor(i * W_old / W'), so at most one global batch is seen twice);
//     the iteration counter is renumbered for the new iterations per epoch, so the learning-rate
//     and density schedules keep their place in epochs. The learning rate is not rescaled for the
//     smaller or larger global batch;
//   - inside an epoch the epoch's partial loss sum is handed over like v (so the epoch's mean
//     covers every batch taken), the byte counters are each rank's own (a joining rank's start at
//     zero), a joining rank's compressor RNG is its own fresh one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/train/checkpoint.h"

namespace dgc::train {

// What `--resume auto` found at the checkpoint prefix; every rank holds the same.
struct AutoResume {
  enum class Kind : uint8_t {
    kFresh,      // no rank has a checkpoint: start a new run
    kSameWorld,  // resume from `step` as --resume-step would
    kNewWorld,   // the set of `step` was written by `stored_world` ranks, not this many
  } kind = Kind::kFresh;
  int64_t step = -1;
  int stored_world = 0;
};

// Collective. Lists every rank's checkpoint steps; rank 0 then picks the newest step of its own
// whose set is complete: every rank r < min(W, W_old) lists it, and (W_old > W) the files of the
// ranks r >= W exist on rank 0's view of the path. W_old is read from rank 0's file of the step.
// Throws dgc::DataError (on every rank) when some rank has checkpoints but no complete set exists
// or rank 0's file cannot be read.
AutoResume choose_auto_resume(comm::Communicator& comm, const std::string& prefix,
                              comm::Timeout timeout);

// The old ranks whose per-rank state new rank `rank` of `world` inherits: r < stored_world with
// r % world == rank, ascending (empty: a joining rank).
std::vector<int> inherited_ranks(int rank, int world, int stored_world);

// Where a run of `new_iterations_per_epoch` iterations per epoch continues when a set written
// after `iteration` steps, `epochs_done` finished epochs of `old_iterations_per_epoch` by
// `stored_world` ranks is resumed by `world` ranks (see the file comment).
int64_t rescaled_iteration(int64_t iteration, int64_t epochs_done, int64_t old_iterations_per_epoch,
                           int stored_world, int world, int64_t new_iterations_per_epoch);

// Pure (no I/O). The checkpoint new rank `rank` of `world` loads (DistributedOptimizer::load,
// then the trainer's records) instead of a file of its own:
//   inherited: the files of inherited_ranks(rank, world, W_old), in that order (empty: joining);
//   rank0:     old rank 0's file (the shared state, and the base of a joining rank);
//   fresh:     this rank's optimizer state before any load (DistributedOptimizer::save: a joining
//              rank's RNG and zero byte counters);
//   settings:  this run's optimizer settings; the stored ones may differ from them only in what
//              the world size changes (iterations_per_epoch, warmup_stage_iterations);
//   iterations_per_epoch: this run's.
// Throws dgc::DataError naming the file when the files disagree with each other or with
// `settings`, or a record is missing.
CheckpointFile rescale_checkpoint(const std::vector<CheckpointFile>& inherited,
                                  const CheckpointFile& rank0, const CheckpointFile& fresh,
                                  int rank, int world, const std::string& settings,
                                  int64_t iterations_per_epoch, bool lr_follows_world_size = false);

// Collective. Reads the files rank `comm.rank()` needs for a kNewWorld resume of `step` and
// returns rescale_checkpoint's result; a file that cannot be read stops every rank with a
// DataError naming it.
CheckpointFile read_rescaled_checkpoint(comm::Communicator& comm, const std::string& prefix,
                                        const AutoResume& found, const CheckpointFile& fresh,
                                        const std::string& settings, int64_t iterations_per_epoch,
                                        comm::Timeout timeout, bool lr_follows_world_size = false);

}  // namespace dgc::train
