#include "dgc/comm/communicator.h"

#include <cstring>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"

namespace dgc::comm {

void broadcast_floats(Communicator& comm, std::span<float> values, int root, Timeout timeout) {
  comm.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(values.data()), values.size_bytes()),
                 root, timeout);
}

ByteCounters ring_allgatherv_bytes(std::span<const uint64_t> sizes, int rank) {
  const int n = static_cast<int>(sizes.size());
  DGC_CHECK(rank >= 0 && rank < n, "rank ", rank, " outside [0, ", n, ")");
  ByteCounters c;
  if (n == 1) return c;
  const int next = (rank + 1) % n;
  for (int i = 0; i < n; ++i) {
    if (i != next) c.sent += sizes[i];
    if (i != rank) c.received += sizes[i];
  }
  return c;
}

ByteCounters direct_alltoallv_bytes(std::span<const uint64_t> send_sizes,
                                    std::span<const uint64_t> receive_sizes, int rank) {
  const int n = static_cast<int>(send_sizes.size());
  DGC_CHECK_EQ(receive_sizes.size(), send_sizes.size(), "one receive size per rank");
  DGC_CHECK(rank >= 0 && rank < n, "rank ", rank, " outside [0, ", n, ")");
  ByteCounters c;
  if (n == 1) return c;
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    c.sent += sizeof(uint64_t) + send_sizes[p];
    c.received += sizeof(uint64_t) + receive_sizes[p];
  }
  return c;
}

ByteCounters ring_allreduce_bytes(uint64_t bytes, int world_size) {
  DGC_CHECK_GE(world_size, 1, "world size");
  const uint64_t n = static_cast<uint64_t>(world_size);
  const uint64_t each_way = 2 * (n - 1) * bytes / n;
  return {each_way, each_way};
}

ByteCounters tree_broadcast_bytes(uint64_t bytes, int rank, int root, int world_size) {
  DGC_CHECK(world_size >= 1 && rank >= 0 && rank < world_size && root >= 0 && root < world_size,
            "rank ", rank, ", root ", root, ", world size ", world_size);
  // Mirrors the binomial tree of gloo::broadcast: virtual rank 0 is the root; in round i a
  // rank whose low i+1 bits are clear sends to vrank ^ (1 << i) when that rank exists.
  const uint64_t vsize = static_cast<uint64_t>(world_size);
  const uint64_t vrank =
      (static_cast<uint64_t>(rank) + vsize - static_cast<uint64_t>(root)) % vsize;
  int dim = 0;
  while ((uint64_t{1} << dim) < vsize) ++dim;
  ByteCounters c;
  uint64_t mask = (uint64_t{1} << dim) - 1;
  for (int i = 0; i < dim; ++i) {
    mask ^= uint64_t{1} << i;
    if ((vrank & mask) != 0) continue;
    const uint64_t vpeer = vrank ^ (uint64_t{1} << i);
    if (vpeer >= vsize) continue;
    if ((vrank & (uint64_t{1} << i)) == 0) {
      c.sent += bytes;
    } else {
      c.received += bytes;
    }
  }
  return c;
}

}  // namespace dgc::comm
