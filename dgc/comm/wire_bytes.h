// Wire bytes of the collectives' algorithms: what one rank puts on the wire and takes off it.
// Both backends count with these (Communicator::bytes()), and the exchange uses them to report
// what a dense exchange would have sent. Pure functions, no communication.
//
// The algorithms are Gloo's: a ring allgather (rank r forwards every message but rank
// (r+1)%N's and receives every message but its own), a ring allreduce (reduce-scatter then
// allgather: 2(N-1)/N of the buffer each way) and a binomial-tree broadcast. Open MPI picks its
// own algorithms at run time; its counts are the same estimates.
#pragma once

#include <cstdint>
#include <span>

#include "dgc/comm/communicator.h"

namespace dgc::comm {

// Ring allgather of messages of `sizes[i]` bytes from rank i, seen from `rank`.
ByteCounters ring_allgatherv_bytes(std::span<const uint64_t> sizes, int rank);

// Direct all-to-all (Communicator::alltoallv) seen from `rank`: the size phase (8 bytes to and
// from every other rank) plus every payload sent to, and received from, another rank.
// send_sizes[p]: bytes this rank sends to p; receive_sizes[p]: bytes p sends to this rank.
ByteCounters direct_alltoallv_bytes(std::span<const uint64_t> send_sizes,
                                    std::span<const uint64_t> receive_sizes, int rank);

// Ring allreduce of `bytes` bytes over `world_size` ranks: 2(N-1)/N * bytes each way (rounded
// down); 0 for one rank.
ByteCounters ring_allreduce_bytes(uint64_t bytes, int world_size);

// Binomial-tree broadcast of `bytes` from `root`, seen from `rank`: every rank but the root
// receives the buffer once; a rank sends it once per child in the tree.
ByteCounters tree_broadcast_bytes(uint64_t bytes, int rank, int root, int world_size);

}  // namespace dgc::comm
