#include "dgc/comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"

namespace dgc::comm {

Communicator::Communicator(Timeout default_timeout) : default_timeout_(default_timeout) {
  DGC_CHECK(default_timeout.count() > 0, "a communicator's default timeout must be positive, got ",
            default_timeout.count(), " ms");
}

Timeout Communicator::Call::remaining() const {
  const auto left = std::chrono::duration_cast<Timeout>(deadline - Clock::now());
  return std::max(left, Timeout(1));
}

Communicator::Call Communicator::begin(const char* op, Timeout timeout) const {
  if (timeout == kUnsetTimeout) timeout = default_timeout_;
  DGC_CHECK(timeout.count() > 0, op, ": a timeout must be positive (or kUnsetTimeout for the ",
            "communicator's default), got ", timeout.count(), " ms");
  if (!failure_.empty()) {
    throw CommError(
        detail::concat(backend(), " ", op, " on rank ", rank(),
                       ": the communicator is unusable after an earlier error: ", failure_));
  }
  const auto now = Clock::now();
  return {op, timeout, now, now + timeout};
}

template <typename F>
auto Communicator::guarded(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    if (failure_.empty()) {
      failure_ = e.what();
      on_failure();
    }
    throw;
  }
}

void Communicator::fail(const std::string& what) {
  failure_ = what;
  on_failure();
  throw CommError(what);
}

void Communicator::check_announced(const char* op, std::span<const uint64_t> sizes) {
  if (sizes.size() != static_cast<size_t>(size())) {
    fail(detail::concat(op, ": the engine returned ", sizes.size(), " sizes for ", size(),
                        " ranks"));
  }
  for (size_t r = 0; r < sizes.size(); ++r) {
    if (sizes[r] > kMaxMessageBytes) {
      fail(detail::concat(op, ": rank ", r, " announced a message of ", sizes[r],
                          " bytes, over the limit of ", kMaxMessageBytes,
                          " (corrupt or mismatched peer)"));
    }
  }
}

std::vector<size_t> Communicator::offsets_of(std::span<const uint64_t> sizes) {
  std::vector<size_t> offsets(sizes.size(), 0);
  for (size_t r = 1; r < sizes.size(); ++r) offsets[r] = offsets[r - 1] + sizes[r - 1];
  return offsets;
}

std::span<const uint8_t> Communicator::packed(std::span<const uint8_t> send,
                                              std::span<const uint64_t> offsets,
                                              std::span<const uint64_t> sizes,
                                              std::vector<uint8_t>& storage) {
  const std::vector<size_t> back_to_back = offsets_of(sizes);
  if (std::equal(offsets.begin(), offsets.end(), back_to_back.begin(), back_to_back.end())) {
    return send;
  }
  const uint64_t total = sizes.empty() ? 0 : back_to_back.back() + sizes.back();
  storage.resize(total + 1);  // + 1: never a null buffer
  for (size_t p = 0; p < sizes.size(); ++p) {
    DGC_CHECK_LE(offsets[p] + sizes[p], send.size(), "alltoallv message ", p,
                 " past the send buffer");
    if (sizes[p] > 0) {
      std::memcpy(storage.data() + back_to_back[p], send.data() + offsets[p], sizes[p]);
    }
  }
  return {storage.data(), total};
}

namespace {
// The messages of a buffer that holds them back to back, one vector each.
std::vector<std::vector<uint8_t>> split(const uint8_t* data, std::span<const size_t> offsets,
                                        std::span<const uint64_t> sizes) {
  std::vector<std::vector<uint8_t>> out(sizes.size());
  for (size_t r = 0; r < sizes.size(); ++r)
    out[r].assign(data + offsets[r], data + offsets[r] + sizes[r]);
  return out;
}
}  // namespace

ByteCounters Communicator::allgatherv_payload_bytes(std::span<const uint64_t> sizes) const {
  return ring_allgatherv_bytes(sizes, rank());
}

std::vector<std::vector<uint8_t>> Communicator::allgatherv(std::span<const uint8_t> message,
                                                           Timeout timeout) {
  const Call call = begin("allgatherv", timeout);
  const int n = size();
  if (n == 1) return {std::vector<uint8_t>(message.begin(), message.end())};
  // Sizes first: a fixed-size allgather of one u64 per rank.
  const std::vector<uint64_t> sizes =
      guarded([&] { return allgather_sizes(message.size(), call.phase("allgatherv (sizes)")); });
  check_announced("allgatherv", sizes);
  bytes_ += ring_allgatherv_bytes(std::vector<uint64_t>(n, sizeof(uint64_t)), rank());
  // Then the payload with exact counts, this rank's message in place.
  const std::vector<size_t> offsets = offsets_of(sizes);
  const uint64_t total = offsets[n - 1] + sizes[n - 1];
  std::vector<uint8_t> flat(total);
  if (!message.empty()) std::memcpy(flat.data() + offsets[rank()], message.data(), message.size());
  if (total > 0) {
    guarded([&] { allgatherv_payload(flat, sizes, call); });
    bytes_ += allgatherv_payload_bytes(sizes);
  }
  auto out = split(flat.data(), offsets, sizes);
  on_delivered("allgatherv", out);
  return out;
}

std::vector<std::vector<uint8_t>> Communicator::alltoallv(
    std::span<const std::span<const uint8_t>> messages, Timeout timeout) {
  const int n = size();
  DGC_CHECK_EQ(messages.size(), static_cast<size_t>(n), "alltoallv takes one message per rank");
  const Call call = begin("alltoallv", timeout);
  if (n == 1) return {std::vector<uint8_t>(messages[0].begin(), messages[0].end())};
  // Sizes first: one u64 to every rank, directly.
  std::vector<uint64_t> send_sizes(n);
  for (int p = 0; p < n; ++p) send_sizes[p] = messages[p].size();
  const std::vector<uint64_t> receive_sizes =
      guarded([&] { return alltoall_sizes(send_sizes, call.phase("alltoallv (sizes)")); });
  check_announced("alltoallv", receive_sizes);
  // Then every payload at once, with exact counts. The same message to every rank (the
  // exchange's usual case) is sent from its one copy; otherwise the messages are packed back to
  // back. One byte of slack keeps the buffers non-null when everything is empty.
  const std::vector<size_t> receive_offsets = offsets_of(receive_sizes);
  const uint64_t receive_total = receive_offsets[n - 1] + receive_sizes[n - 1];
  const bool same =
      !messages[0].empty() && std::all_of(messages.begin(), messages.end(), [&](const auto& m) {
        return m.data() == messages[0].data() && m.size() == messages[0].size();
      });
  std::vector<uint64_t> send_offsets(n, 0);
  std::vector<uint8_t> packed_send;
  std::span<const uint8_t> send = messages[0];
  if (!same) {
    const std::vector<size_t> offsets = offsets_of(send_sizes);
    send_offsets.assign(offsets.begin(), offsets.end());
    packed_send.resize(offsets[n - 1] + send_sizes[n - 1] + 1);
    for (int p = 0; p < n; ++p) {
      if (!messages[p].empty()) {
        std::memcpy(packed_send.data() + offsets[p], messages[p].data(), messages[p].size());
      }
    }
    send = {packed_send.data(), packed_send.size() - 1};
  }
  std::vector<uint8_t> receive(receive_total + 1);
  guarded([&] {
    alltoallv_payload(send, send_offsets, send_sizes, {receive.data(), receive_total},
                      receive_sizes, call);
  });
  bytes_ += direct_alltoallv_bytes(send_sizes, receive_sizes, rank());
  auto out = split(receive.data(), receive_offsets, receive_sizes);
  on_delivered("alltoallv", out);
  return out;
}

void Communicator::allreduce_sum(std::span<float> values, Timeout timeout) {
  const Call call = begin("allreduce", timeout);
  if (size() == 1 || values.empty()) return;
  guarded([&] { allreduce_sum_primitive(values, call); });
  bytes_ += ring_allreduce_bytes(values.size_bytes(), size());
}

void Communicator::broadcast(std::span<uint8_t> data, int root, Timeout timeout) {
  const Call call = begin("broadcast", timeout);
  DGC_CHECK(root >= 0 && root < size(), "broadcast root ", root, " outside [0, ", size(), ")");
  if (size() == 1 || data.empty()) return;
  guarded([&] { broadcast_primitive(data, root, call); });
  bytes_ += tree_broadcast_bytes(data.size(), rank(), root, size());
}

void Communicator::barrier(Timeout timeout) {
  const Call call = begin("barrier", timeout);
  if (size() == 1) return;
  guarded([&] { barrier_primitive(call); });
}

ForwardingCommunicator::ForwardingCommunicator(Communicator& inner)
    : Communicator(inner.default_timeout()), inner_(inner) {}

std::vector<uint64_t> ForwardingCommunicator::allgather_sizes(uint64_t mine, const Call& call) {
  return inner_.allgather_sizes(mine, call);
}
void ForwardingCommunicator::allgatherv_payload(std::span<uint8_t> flat,
                                                std::span<const uint64_t> sizes, const Call& call) {
  inner_.allgatherv_payload(flat, sizes, call);
}
std::vector<uint64_t> ForwardingCommunicator::alltoall_sizes(std::span<const uint64_t> send,
                                                             const Call& call) {
  return inner_.alltoall_sizes(send, call);
}
void ForwardingCommunicator::alltoallv_payload(std::span<const uint8_t> send,
                                               std::span<const uint64_t> send_offsets,
                                               std::span<const uint64_t> send_sizes,
                                               std::span<uint8_t> receive,
                                               std::span<const uint64_t> receive_sizes,
                                               const Call& call) {
  inner_.alltoallv_payload(send, send_offsets, send_sizes, receive, receive_sizes, call);
}
void ForwardingCommunicator::allreduce_sum_primitive(std::span<float> values, const Call& call) {
  inner_.allreduce_sum_primitive(values, call);
}
void ForwardingCommunicator::broadcast_primitive(std::span<uint8_t> data, int root,
                                                 const Call& call) {
  inner_.broadcast_primitive(data, root, call);
}
void ForwardingCommunicator::barrier_primitive(const Call& call) { inner_.barrier_primitive(call); }
ByteCounters ForwardingCommunicator::allgatherv_payload_bytes(
    std::span<const uint64_t> sizes) const {
  return inner_.allgatherv_payload_bytes(sizes);
}
void ForwardingCommunicator::on_failure() {
  if (inner_.failure_.empty()) inner_.failure_ = failure();
  inner_.on_failure();
}

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
