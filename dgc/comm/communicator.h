// The communication layer: a group of ranks and the collectives DGC needs, over real engines
// (Gloo over TCP, Open MPI, a user's c10d process group). Knows only bytes, floats and counts;
// nothing about DGC.
//
// Every collective is collective: all ranks call it in the same order with compatible arguments.
// Every collective takes a timeout; when a peer dies or stalls, each surviving rank gets a
// dgc::CommError (dgc::TimeoutError on timeout) within about that timeout, naming the peer when
// the engine tells which. After an error the communicator is unusable: every later collective
// throws a CommError saying why, at once.
// Thread-safety: one thread per Communicator at a time.
//
// Timeouts: a collective called with kUnsetTimeout (the default argument) uses the
// communicator's default_timeout(), set where it was created (GlooOptions::timeout, the argument
// of connect_mpi, ProcessGroupOptions::timeout); any other value must be positive and is used as
// given. A collective's timeout bounds the whole call (allgatherv's size exchange and payload
// together).
// Wire bytes: bytes() counts what the collectives' algorithms send (see wire_bytes.h).
//
// The shape is c10d's Backend: the public collectives here are not virtual. They resolve the
// timeout, check the arguments and that the communicator is usable, take the trivial cases (one
// rank, nothing to send), run the variable-size collectives as sizes first and then the payload
// with exact counts (refusing an announced size over kMaxMessageBytes before it is allocated),
// record a failure and count wire bytes. A backend implements only its transport's primitives
// (the protected virtuals below), each called with the collective's deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dgc::comm {

using Timeout = std::chrono::milliseconds;
// A collective's timeout argument meaning "the communicator's default_timeout()": an explicit
// unset value, never a real duration.
inline constexpr Timeout kUnsetTimeout{-1};
// The default timeout a communicator is created with when its options name none (GlooOptions,
// connect_mpi).
inline constexpr Timeout kDefaultTimeout{std::chrono::seconds(60)};

// Upper bound on one rank's message in allgatherv and alltoallv: a corrupt or mismatched peer's
// size must not become an allocation.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 34;

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
  virtual std::string backend() const = 0;  // "gloo", "mpi" or "c10d:<backend>"

  // Allgather of variable-size messages: sizes first, then the payload with exact counts.
  // Returns size() messages, index = rank (this rank's own message included).
  std::vector<std::vector<uint8_t>> allgatherv(std::span<const uint8_t> message,
                                               Timeout timeout = kUnsetTimeout);

  // All-to-all of variable-size messages: messages[p] goes to rank p (messages[rank()] comes back
  // to this rank without travelling). Sizes first (an all-to-all of one u64 per pair of ranks),
  // then every payload at once: each rank sends directly to every other rank, so each phase is
  // one round of latency and nothing is forwarded (unlike the ring of allgatherv). Returns
  // size() messages, index = sending rank. messages.size() must equal size() (dgc::InvalidArgument
  // otherwise, before anything is sent). Same timeout, error and byte-counting conventions as
  // allgatherv; wire bytes: see direct_alltoallv_bytes in wire_bytes.h.
  std::vector<std::vector<uint8_t>> alltoallv(std::span<const std::span<const uint8_t>> messages,
                                              Timeout timeout = kUnsetTimeout);

  // In-place elementwise sum over ranks.
  void allreduce_sum(std::span<float> values, Timeout timeout = kUnsetTimeout);

  // In-place broadcast of `data` from `root`; data.size() must be the same on every rank.
  void broadcast(std::span<uint8_t> data, int root, Timeout timeout = kUnsetTimeout);

  void barrier(Timeout timeout = kUnsetTimeout);

  const ByteCounters& bytes() const { return bytes_; }

  Timeout default_timeout() const { return default_timeout_; }

  // Empty while the communicator is usable; after a failed collective, what went wrong.
  const std::string& failure() const { return failure_; }

 protected:
  using Clock = std::chrono::steady_clock;

  // default_timeout must be positive.
  explicit Communicator(Timeout default_timeout);

  // One collective in progress: its name for messages ("allgatherv (sizes)", "allreduce"), its
  // resolved timeout, when it began and its deadline.
  struct Call {
    const char* op;
    Timeout timeout;
    Clock::time_point start;
    Clock::time_point deadline;
    // Time left, at least 1 ms (engines read 0 as "no timeout").
    Timeout remaining() const;
    Call phase(const char* name) const { return {name, timeout, start, deadline}; }
  };

  // The transport primitives. Each is collective, runs with the deadline of `call`, throws
  // CommError or TimeoutError on failure (the base then marks the communicator unusable), and
  // is called only with size() > 1.
  //   allgather_sizes: every rank's u64, index = rank.
  //   allgatherv_payload: `flat` holds every rank's message at its offset (the prefix sums of
  //       `sizes`); this rank's is in place, the others are to be filled. Called only when the
  //       total is positive.
  //   alltoall_sizes: send[p] goes to rank p; returns what each rank sent this one.
  //   alltoallv_payload: the message for rank p is send_sizes[p] bytes of `send` from
  //       send_offsets[p] (messages may overlap: the same message to every rank is one copy,
  //       every offset 0); `receive` gets those from rank 0, 1, ... back to back, with the
  //       sizes given.
  virtual std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call& call) = 0;
  virtual void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                                  const Call& call) = 0;
  virtual std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t> send,
                                               const Call& call) = 0;
  virtual void alltoallv_payload(std::span<const uint8_t> send,
                                 std::span<const uint64_t> send_offsets,
                                 std::span<const uint64_t> send_sizes, std::span<uint8_t> receive,
                                 std::span<const uint64_t> receive_sizes, const Call& call) = 0;
  virtual void allreduce_sum_primitive(std::span<float> values, const Call& call) = 0;
  virtual void broadcast_primitive(std::span<uint8_t> data, int root, const Call& call) = 0;
  virtual void barrier_primitive(const Call& call) = 0;

  // Where each message starts in a buffer holding them back to back: the prefix sums of sizes.
  static std::vector<size_t> offsets_of(std::span<const uint64_t> sizes);
  // alltoallv_payload's send messages back to back (for engines that take only that form): `send`
  // itself when they already are, else a copy packed into `storage`.
  static std::span<const uint8_t> packed(std::span<const uint8_t> send,
                                         std::span<const uint64_t> offsets,
                                         std::span<const uint64_t> sizes,
                                         std::vector<uint8_t>& storage);

  // The wire bytes of allgatherv's payload phase; by default a ring over the exact sizes (an
  // engine without variable-size allgather pads every message to the largest).
  virtual ByteCounters allgatherv_payload_bytes(std::span<const uint64_t> sizes) const;

  // Called once, when the communicator is first marked unusable (a failed primitive, or a size
  // over kMaxMessageBytes found here): a backend that can tell its peers at once (Gloo closes
  // its connections) does it here.
  virtual void on_failure() {}

  // Called with what allgatherv or alltoallv (`collective`) delivers, index = sending rank, just
  // before it is returned; the default does nothing. The seam for decorators built on
  // ForwardingCommunicator (fault injection: a corrupt, forged or replayed message).
  virtual void on_delivered(const char* collective, std::vector<std::vector<uint8_t>>& messages) {}

 private:
  friend class ForwardingCommunicator;

  Call begin(const char* op, Timeout timeout) const;
  // Runs `body`; any exception marks the communicator unusable (failure()) and is rethrown.
  template <typename F>
  auto guarded(F&& body) -> decltype(body());
  [[noreturn]] void fail(const std::string& what);
  void check_announced(const char* op, std::span<const uint64_t> sizes);

  ByteCounters bytes_;
  Timeout default_timeout_;
  std::string failure_;
};

// A communicator that runs every primitive on another one (`inner`, which must outlive it),
// with its own failure state and byte counts: the base of decorators, which override
// on_delivered (or a primitive) to change what the wrapped communicator delivers, as a faulty
// link or a peer of another job would. Collective like the communicator it wraps.
class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator& inner);
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }

 protected:
  std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call& call) override;
  void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                          const Call& call) override;
  std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t> send, const Call& call) override;
  void alltoallv_payload(std::span<const uint8_t> send, std::span<const uint64_t> send_offsets,
                         std::span<const uint64_t> send_sizes, std::span<uint8_t> receive,
                         std::span<const uint64_t> receive_sizes, const Call& call) override;
  void allreduce_sum_primitive(std::span<float> values, const Call& call) override;
  void broadcast_primitive(std::span<uint8_t> data, int root, const Call& call) override;
  void barrier_primitive(const Call& call) override;
  ByteCounters allgatherv_payload_bytes(std::span<const uint64_t> sizes) const override;
  void on_failure() override;

 private:
  Communicator& inner_;
};

// Convenience: broadcast of floats as bytes.
void broadcast_floats(Communicator& comm, std::span<float> values, int root,
                      Timeout timeout = kUnsetTimeout);

}  // namespace dgc::comm
