// What the exchange's algorithms share (allgather.h, sparse_allreduce.h, dense_path.h): the
// job's identity, the context of one iteration, this rank's message encoder with its byte count,
// the validation of what arrived, and the clock that splits a run into phases. Exchange::run
// builds a MessageContext per iteration, calls one algorithm with it and counts what the
// algorithm reports into ExchangeBytes and ExchangeTimings (exchange.h).
//
// Not thread-safe: one iteration's context, encoder and buffers belong to the thread running it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/auth.h"
#include "dgc/core/codec.h"
#include "dgc/core/options.h"
#include "dgc/core/selection.h"
#include "dgc/exchange/layout.h"

namespace dgc {

// The job as every message names it: the run id every rank learnt at the handshake and, with a
// job key, the authenticator that tags and verifies every message (exchange.h, at the top).
struct JobIdentity {
  RunId run_id{};
  std::optional<MessageAuthenticator> authenticator;
  // The authenticator, or null without a job key.
  const MessageAuthenticator* auth() const { return authenticator ? &*authenticator : nullptr; }
};

// The exchange's message buffers, kept from one iteration to the next: `message` keeps its
// capacity; `received` is what each phase's collective returns.
struct MessageBuffers {
  std::vector<uint8_t> message;                // this rank's message to every rank
  std::vector<std::vector<uint8_t>> received;  // the messages of the current phase, by rank
  std::vector<ValidatedMessage> validated;     // ... validated (they refer into `received`)
  // Drops the last phase's messages: before a collective brings the next ones (otherwise both
  // are held at once, N messages each: at 256 ranks, tens of MB per rank), and at the end of
  // an iteration, so that nothing is held between iterations.
  void release_received() {
    validated.clear();
    received = {};
  }
};

// The phases of ExchangeTimings (exchange.h).
enum class Phase : uint8_t { kEncode, kCollective, kValidate, kDecode };

// Splits one run into phases on a steady clock: lap(phase) adds the time since the previous lap
// (or construction) to `phase`.
class PhaseClock {
 public:
  PhaseClock() : last_(Clock::now()) {}
  void lap(Phase phase);
  double seconds(Phase phase) const { return seconds_[static_cast<size_t>(phase)]; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_;
  std::array<double, 4> seconds_{};
};

// What one iteration's algorithm is given. Every member refers to the caller's objects, which
// must outlive the call.
struct MessageContext {
  comm::Communicator& comm;
  const JobIdentity& job;
  const LayoutIndex& layout;
  ValueType value_type;  // of the messages' values (ExchangeOptions::value_type)
  comm::Timeout timeout;
  uint64_t iteration;
  uint16_t flags;  // header flags of this rank's messages (kFlagBadGradient or 0)
  // This rank's selection for each compressed tensor (indices strictly increasing).
  std::span<const Selection> selections;
  // Output: on return from an algorithm, `validated` holds the messages this rank decodes into
  // its updates, one per rank.
  MessageBuffers& buffers;
  PhaseClock& clock;
};

// The bytes of this rank's encoded messages in one iteration (ExchangeBytes' message fields
// before the dense path): total == compressed + dense_path + headers.
struct MessageBytes {
  uint64_t total = 0;
  uint64_t compressed = 0;  // entries of the compressed tensors
  uint64_t dense_path = 0;  // entries of the dense-path group (LayoutIndex::dense_path_group)
  uint64_t headers = 0;     // kMessageHeaderBytes per message, and kTagBytes per tag
};

// What an algorithm returns to Exchange::run.
struct AlgorithmResult {
  int flagged = 0;    // ranks whose message carried kFlagBadGradient (the same on every rank)
  MessageBytes sent;  // this rank's contribution
};

// Encodes this rank's messages of one iteration and counts their bytes. Keeps a reference to
// `context`.
class MessageEncoder {
 public:
  explicit MessageEncoder(const MessageContext& context);
  // Starts a message (the previous one is dropped) with these header flags.
  void begin(uint16_t flags);
  // Appends compressed tensor i's entry.
  void add(size_t i, std::span<const uint32_t> indices, std::span<const float> values);
  // Finishes the message into `out` (cleared first), tagged from this rank to `receiver`
  // (kEveryRank or a rank) when the job has a key.
  void finish(std::vector<uint8_t>& out, uint32_t receiver);
  // The bytes encoded so far (entries as they are added, headers and tags as messages finish).
  const MessageBytes& bytes() const { return bytes_; }

 private:
  const MessageContext& context_;
  MessageWriter writer_;
  MessageBytes bytes_;
};

// Validates context.buffers.received[r] as sent by rank r to `receiver` (kEveryRank or this
// rank) into context.buffers.validated. Returns how many of them carry kFlagBadGradient. Throws
// dgc::DecodeError naming `what` ("message", ...), the sender and the iteration.
int validate_messages(const MessageContext& context, const char* what, uint32_t receiver);

}  // namespace dgc
