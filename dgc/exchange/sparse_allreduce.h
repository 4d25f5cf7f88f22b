// The sparse allreduce (ExchangeAlgorithm::kSparseAllreduce): its driver, sparse_allreduce()
// (collective: every rank calls it in the same iteration), and the pieces that need no
// communication (namespace sparse: region bounds, the owner's reduction and re-selection, the
// hand-back; pure functions, thread-safe). Exchange::run calls the driver for steps 1-4, decodes
// the kept sums, then calls sparse::hand_back and rebalance_regions for steps 5-6.
//
// The algorithm is Ok-Topk's split-and-reduce (Li & Hoefler, PPoPP'22), with DGC's semantics:
//   1. the global index space (the compressed tensors concatenated in layout order) is split
//      into N regions [bounds[p], bounds[p+1]); rank p owns region p;
//   2. every rank sends the part of its selection that falls in region p to rank p (alltoallv;
//      one codec message per owner, the bad-gradient flag in its header);
//   3. owner p sums what it received (colliding indices add) and keeps the quota(c_p, N) entries
//      of largest |sum|, c_p = the number of contributions it received: over all regions about
//      the mean selection count k, a global top-k when the regions are balanced;
//   4. every owner sends its kept sums to every rank (alltoallv with the same message: an
//      allgather in one round) and every rank adds all N messages / N into its update: every
//      rank ends with the same update;
//   5. every rank hands back (Exchange::run's `unapplied`) the (index, value) pairs it selected
//      at indices no owner kept; the optimizer adds them to its residual (velocity), so nothing
//      selected is lost: selected = applied + returned, per rank;
//   6. every ExchangeOptions::rebalance_interval runs the bounds are recomputed from the applied
//      indices (balanced_bounds): each region then holds the same number of them. The applied
//      set is the same on every rank, so the re-balance needs no communication; it follows where
//      the selections fall because the applied set is the top of their sum.
// Volume per rank and iteration: about k(N-1)/N elements received in step 2 and k(N-1)/N in
// step 4, ~2k(N-1)/N in all, against k(N-1) for allgather (Ok-Topk's bound: under 6k).
//
// Why Ok-Topk's scheme and not SparCML's recursive doubling: recursive doubling forwards the
// growing union of supports, so with DGC's mostly disjoint selections a rank still receives
// about k(N-1) elements (SparCML then switches to dense), while the re-selection here bounds the
// volume by ~2k whatever the overlap; it needs only the two collectives the communicator has
// (one round each for the sizes and the payload of each, four in all, independent of N, against
// log2 N for recursive doubling); and what it drops has a natural home in DGC, the residual.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dgc/core/selection.h"
#include "dgc/exchange/context.h"

namespace dgc {

// What the sparse allreduce keeps from one iteration to the next.
struct SparseAllreduceState {
  // The region bounds in the global index space (size N + 1), the same on every rank.
  std::vector<uint64_t> bounds;
  uint64_t runs = 0;  // runs that ended with the kept sums applied (for the re-balance interval)
  std::vector<std::vector<uint8_t>> owner_messages;  // this rank's message to each owner, reused
};

struct SparseAllreduceOptions {
  MessageContext context;
  SparseAllreduceState& state;  // read (bounds) and its buffers reused; must outlive the call
};

// Steps 1-4. On return context.buffers.validated holds the owners' kept sums, one message per
// owner (index = owner), each checked to lie in its owner's region; context.buffers.message is
// this rank's kept sums. When the result's `flagged` > 0 it returns after step 2 instead (every
// rank saw every rank's flag, so all stop there together) and the validated messages are the
// region messages, not to be applied. Only the region messages count as this rank's
// contribution (the result's `sent`). Laps the clock phase by phase. Throws dgc::CommError,
// dgc::DecodeError (naming the sender; kOutOfRange when the ranks disagree on the bounds).
AlgorithmResult sparse_allreduce(const SparseAllreduceOptions& options);

// Step 6, after a run whose kept sums were applied: counts the run and, every `interval` runs
// (every run with interval 1), recomputes state.bounds with balanced_bounds from the applied
// positions. applied[i]: the positions of compressed tensor i that were applied, sorted, each
// once; offsets: LayoutIndex::offsets. No communication: the applied set is the same on every
// rank, so every rank computes the same bounds.
void rebalance_regions(SparseAllreduceState& state, std::span<const std::vector<uint64_t>> applied,
                       std::span<const uint64_t> offsets, int interval, int world_size);

}  // namespace dgc

namespace dgc::sparse {

struct Entry {
  uint64_t index;  // in the global index space
  float value;
  friend bool operator==(const Entry&, const Entry&) = default;
};

// parts + 1 bounds splitting [0, total) into `parts` regions of (nearly) equal size.
std::vector<uint64_t> equal_bounds(uint64_t total, int parts);

// parts + 1 bounds such that each region holds the same number (+-1) of `sorted_indices`
// (strictly increasing, < total); equal_bounds when there are none. bounds[0] = 0,
// bounds[parts] = total, non-decreasing (a region may be empty).
std::vector<uint64_t> balanced_bounds(std::span<const uint64_t> sorted_indices, uint64_t total,
                                      int parts);

// Sums `streams` (each sorted by strictly increasing index) into `out`, sorted by index, one
// entry per distinct index; values are added in stream order. Returns the number of
// contributions (entries over all streams).
uint64_t reduce_sorted(std::span<const std::vector<Entry>> streams, std::vector<Entry>& out);

// How many of its c contributions' sums an owner keeps: ceil(c / world_size).
uint64_t quota(uint64_t contributions, int world_size);

// Keeps the `quota` entries of largest |value| (ties: the lower index), sorted by index. All of
// them when quota >= entries.size().
void keep_largest(std::vector<Entry>& entries, uint64_t quota);

// Step 5 for one tensor: appends to `unapplied` the (index, value) pairs of `selected` whose
// index is not in `applied` (sorted, each once), in selection order.
void hand_back(const Selection& selected, std::span<const uint64_t> applied, Selection& unapplied);

}  // namespace dgc::sparse
