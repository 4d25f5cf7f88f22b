// The communication layer: a group of ranks and the collectives DGC needs, over real engines
// (Gloo over TCP, Open MPI). Knows only bytes, floats and counts; nothing about DGC.
//
// Every collective is collective: all ranks call it in the same order with compatible arguments.
// Every collective takes a timeout; when a peer dies or stalls, each surviving rank gets a
// dgc::CommError (dgc::TimeoutError on timeout) within about that timeout, naming the peer when
// the engine tells which. After an error the communicator is unusable.
// Thread-safety: one thread per Communicator at a time.
//
// Timeouts: a collective called with kDefaultTimeout (the default argument) uses the
// communicator's default_timeout(), set where it was created (GlooOptions::timeout, the argument
// of connect_mpi); any other value is used as given. A collective's timeout bounds the whole call
// (allgatherv's size exchange and payload together).
// Wire bytes: bytes() counts what the collectives' algorithms send (see wire_bytes.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dgc::comm {

using Timeout = std::chrono::milliseconds;
inline constexpr Timeout kDefaultTimeout{std::chrono::seconds(60)};

// Bytes this rank put on the wire and took off it, as estimated from the collective's algorithm
// (e.g. a ring allreduce of B bytes sends 2(N-1)/N * B). Cumulative since construction.
struct ByteCounters {
  uint64_t sent = 0;
  uint64_t received = 0;
  ByteCounters& operator+=(const ByteCounters& other) {
    sent += other.sent;
    received += other.received;
    return *this;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "gloo" or "mpi"

  // Allgather of variable-size messages: sizes first, then the payload with exact counts.
  // Returns size() messages, index = rank (this rank's own message included).
  virtual std::vector<std::vector<uint8_t>> allgatherv(std::span<const uint8_t> message,
                                                       Timeout timeout = kDefaultTimeout) = 0;

  // All-to-all of variable-size messages: messages[p] goes to rank p (messages[rank()] comes back
  // to this rank without travelling). Sizes first (an all-to-all of one u64 per pair of ranks),
  // then every payload at once: each rank sends directly to every other rank, so each phase is
  // one round of latency and nothing is forwarded (unlike the ring of allgatherv). Returns
  // size() messages, index = sending rank. messages.size() must equal size() (dgc::InvalidArgument
  // otherwise, before anything is sent). Same timeout, error and byte-counting conventions as
  // allgatherv; wire bytes: see direct_alltoallv_bytes in wire_bytes.h.
  virtual std::vector<std::vector<uint8_t>> alltoallv(
      std::span<const std::span<const uint8_t>> messages, Timeout timeout = kDefaultTimeout) = 0;

  // In-place elementwise sum over ranks.
  virtual void allreduce_sum(std::span<float> values, Timeout timeout = kDefaultTimeout) = 0;

  // In-place broadcast of `data` from `root`; data.size() must be the same on every rank.
  virtual void broadcast(std::span<uint8_t> data, int root, Timeout timeout = kDefaultTimeout) = 0;

  virtual void barrier(Timeout timeout = kDefaultTimeout) = 0;

  const ByteCounters& bytes() const { return bytes_; }

  Timeout default_timeout() const { return default_timeout_; }

 protected:
  // `timeout`, or default_timeout() when the caller passed kDefaultTimeout.
  Timeout effective_timeout(Timeout timeout) const {
    return timeout == kDefaultTimeout ? default_timeout_ : timeout;
  }

  ByteCounters bytes_;
  Timeout default_timeout_ = kDefaultTimeout;
};

// Convenience: broadcast of floats as bytes.
void broadcast_floats(Communicator& comm, std::span<float> values, int root,
                      Timeout timeout = kDefaultTimeout);

}  // namespace dgc::comm
