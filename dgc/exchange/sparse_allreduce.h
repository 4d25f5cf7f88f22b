// The pieces of the sparse allreduce (ExchangeAlgorithm::kSparseAllreduce) that need no
// communication: region bounds, the owner's reduction and its re-selection. Exchange::run
// composes them with two Communicator::alltoallv calls. Pure functions, thread-safe.
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

}  // namespace dgc::sparse
