// The wire codec: all compressed tensors of one worker and one iteration in one message.
//
// Layout (little endian), version 2:
//   header:  magic "DGC1" (4) | version u8 | value_type u8 | flags u16 | iteration u64 |
//            tensor_count u32 | payload_bytes u32 | crc32 of payload u32 | run id (16) |
//            crc32 of header u32                                               (48 bytes)
//   payload, per tensor: tensor_id varint | numel varint | count varint |
//            index gaps varint * count (first = index, then index[i] - index[i-1] - 1) |
//            values * count (fp32, fp16 or bf16 by value_type)
//   tag:     only with kFlagTagged: HMAC-SHA256 (32) over sender u32 | receiver u32 | header |
//            payload, under the job's exchange key (auth.h)
// flags: bit 0 = kFlagBadGradient, bit 1 = kFlagTagged; every other bit must be 0 (a decoder
// rejects unknown bits). Indices must be strictly increasing and < numel. The exact byte layout
// is the codec's; callers only use the functions below.
//
// The run id names the job (every rank learns it at the exchange handshake) and the iteration
// the step: a receiver that passes a MessageExpectation refuses a message of another job or
// another iteration, and, with a job secret, a message without a valid tag, before anything is
// written. Version 1 (32-byte header, no run id) is no longer read: every rank of a job runs the
// same build, and a v1 message has no job identity to check (DecodeError kBadVersion).
//
// Contract: decoding validates the whole message (magic, version, checksums, the expectation,
// the tag, every varint, every index against the expected numel, exact payload length) before
// writing anything. A bad message throws dgc::DecodeError with the Reason and a message that
// says what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dgc/core/auth.h"
#include "dgc/core/options.h"

namespace dgc {

inline constexpr uint8_t kCodecVersion = 2;
// Bytes of a message's header; the rest of a message is its payload (and its tag, if tagged).
inline constexpr size_t kMessageHeaderBytes = 48;

// Bits of the header's flags field (covered by the header checksum).
// kFlagBadGradient: the sender's gradient was not finite; receivers must apply nothing this
// iteration (the exchange counts the flagged senders).
// kFlagTagged: a kTagBytes HMAC-SHA256 tag follows the payload (set by the tagging finish()).
inline constexpr uint16_t kFlagBadGradient = 1;
inline constexpr uint16_t kFlagTagged = 2;
inline constexpr uint16_t kKnownFlags = kFlagBadGradient | kFlagTagged;

// Who sent a message to whom, bound into its tag so that a message replayed from another rank
// (or sent to another rank) is refused. kEveryRank: a message every rank receives.
inline constexpr uint32_t kEveryRank = 0xFFFFFFFFu;
struct MessageRoute {
  uint32_t sender = 0;
  uint32_t receiver = kEveryRank;
};

class MessageWriter {
 public:
  // `run_id`: the job's (auth.h); kept across reset().
  MessageWriter(ValueType value_type, uint64_t iteration, const RunId& run_id = {});

  // Appends one tensor. `indices` strictly increasing and < numel; values.size() == indices.size().
  // Values are rounded to the value type (see round_to in compressor.h).
  void add(uint32_t tensor_id, uint64_t numel, std::span<const uint32_t> indices,
           std::span<const float> values);

  // Payload bytes appended so far (the message is kMessageHeaderBytes more): the difference
  // around add() is what one tensor's entry costs.
  size_t payload_bytes() const { return payload_.size(); }

  // Sets the header's flags (kFlagBadGradient; 0 after construction and reset()). kFlagTagged
  // is the tagging finish()'s.
  void set_flags(uint16_t flags);

  // Finishes the message into `out` (cleared first). The writer may be reused after reset().
  void finish(std::vector<uint8_t>& out);
  // Finishes a tagged message: kFlagTagged set and the HMAC-SHA256 tag of `route` and the
  // message under `auth` appended (kTagBytes more).
  void finish(std::vector<uint8_t>& out, const MessageAuthenticator& auth, MessageRoute route);
  void reset(ValueType value_type, uint64_t iteration);

 private:
  void finish(std::vector<uint8_t>& out, uint16_t extra_flags, size_t trailer_bytes);

  ValueType value_type_;
  uint64_t iteration_;
  RunId run_id_{};
  uint16_t flags_ = 0;
  uint32_t tensor_count_ = 0;
  std::vector<uint8_t> payload_;
};

struct MessageInfo {
  uint8_t version = 0;
  ValueType value_type = ValueType::kFloat32;
  uint16_t flags = 0;  // kFlag* bits
  uint64_t iteration = 0;
  RunId run_id{};
  uint32_t tensor_count = 0;
  uint64_t element_count = 0;  // selected elements over all tensors
};

// What a receiver knows about the message it expects, checked by validation (after the header
// checksum, before the payload): a mismatch is a DecodeError with Reason kForeignRun,
// kWrongIteration or kBadTag. `authenticator` non-null: the message must carry a valid tag for
// `route` (kBadTag otherwise, also for an untagged message); null: the receiver has no job
// secret and a tagged message is refused too (the ranks disagree on the secret). The pointee
// must outlive the call.
struct MessageExpectation {
  RunId run_id{};
  uint64_t iteration = 0;
  const MessageAuthenticator* authenticator = nullptr;
  MessageRoute route;
};

// A message that validation accepted against a receiver's layout. Only validate() makes one (the
// constructor is private), so the decode_add overload that takes one can skip the checks (no
// second checksum, no bounds checks per element) and still never reads unvalidated bytes or
// writes out of bounds. It refers to the message's bytes without copying them: the bytes must
// stay alive and unchanged while it is used. Cheap to move; not thread-safe to share while the
// bytes change.
class ValidatedMessage {
 public:
  // Validates `message` against the receiver's layout: tensor t must have expected_numels[t]
  // elements; with `expect`, also against the receiver's job, iteration and key (a tag is
  // otherwise skipped unchecked: only for tools that read messages outside a job). Throws
  // dgc::DecodeError.
  static ValidatedMessage validate(std::span<const uint8_t> message,
                                   std::span<const uint64_t> expected_numels,
                                   const MessageExpectation* expect = nullptr);

  const MessageInfo& info() const { return info_; }
  std::span<const uint8_t> bytes() const { return bytes_; }
  // The layout it was validated against.
  std::span<const uint64_t> expected_numels() const { return expected_numels_; }

 private:
  ValidatedMessage(std::span<const uint8_t> bytes, std::span<const uint64_t> expected_numels,
                   const MessageInfo& info)
      : bytes_(bytes),
        expected_numels_(expected_numels.begin(), expected_numels.end()),
        info_(info) {}

  std::span<const uint8_t> bytes_;
  std::vector<uint64_t> expected_numels_;
  MessageInfo info_;
};

// Validates `message` against the receiver's layout: tensor t must have expected_numels[t]
// elements. Throws dgc::DecodeError; returns a summary when valid.
MessageInfo validate_message(std::span<const uint8_t> message,
                             std::span<const uint64_t> expected_numels);

// Validates, then calls visit(tensor_id, index, value) for every element in message order.
using ElementVisitor = std::function<void(uint32_t tensor_id, uint64_t index, float value)>;
MessageInfo decode_message(std::span<const uint8_t> message,
                           std::span<const uint64_t> expected_numels, const ElementVisitor& visit);

// Calls visit(tensor_id, index, value) for every element of an already validated message, in
// message order, without validating it again.
void for_each_element(const ValidatedMessage& message, const ElementVisitor& visit);

// Validates, then outputs[tensor_id][index] += scale * value for every element. outputs[t].size()
// is the expected numel of tensor t. Writes nothing if the message is invalid.
MessageInfo decode_add(std::span<const uint8_t> message, std::span<const std::span<float>> outputs,
                       float scale);

// outputs[tensor_id][index] += scale * value for every element of an already validated message,
// without validating it again. outputs[t].size() must equal the numel `message` was validated
// against for every t (checked before anything is written; a mismatch throws dgc::Error).
// If `written` is not empty it must have one vector per output; the index of every element is
// appended to written[tensor_id] in message order (an index selected by several messages
// appears once per message), so that a caller can later reset exactly these positions.
void decode_add(const ValidatedMessage& message, std::span<const std::span<float>> outputs,
                float scale, std::span<std::vector<uint64_t>> written = {});

}  // namespace dgc
