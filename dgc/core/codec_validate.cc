// Validation of a DGC message (codec.h, ValidatedMessage): every byte checked before anything
// is decoded.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "dgc/core/bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/codec_format.h"
#include "dgc/core/crc32.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"

namespace dgc {

using namespace codec_format;

namespace {

// A bounds-checked reader over the payload. Every read either succeeds inside [p, end) or throws.
class Reader {
 public:
  Reader(const uint8_t* begin, const uint8_t* end) : p_(begin), end_(end) {}

  // A canonical LEB128 varint of at most 64 bits (no overlong encodings).
  uint64_t varint(uint32_t entry, const char* field) {
    uint64_t result = 0;
    switch (get_varint(p_, end_, result)) {
      case VarintRead::kOk:
        return result;
      case VarintRead::kTruncated:
        fail(DecodeError::Reason::kMalformed,
             detail::concat("tensor entry ", entry, ": ", field, " runs past the payload end"));
      case VarintRead::kNotCanonical:
        break;
    }
    fail(DecodeError::Reason::kMalformed,
         detail::concat("tensor entry ", entry, ": ", field, " is not a canonical 64-bit varint"));
  }

  const uint8_t* position() const { return p_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void skip(size_t bytes) { p_ += bytes; }  // callers check remaining() first

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// Validates the whole message and returns its summary; throws dgc::DecodeError.
MessageInfo parse(std::span<const uint8_t> message, std::span<const uint64_t> expected_numels,
                  const MessageExpectation* expect) {
  using Reason = DecodeError::Reason;
  const uint8_t* bytes = message.data();
  const size_t size = message.size();
  if (size > 0 && std::memcmp(bytes, kMagic, std::min<size_t>(size, 4)) != 0) {
    fail(Reason::kBadMagic, "does not start with the magic bytes \"DGC1\"");
  }
  if (size < 5) {
    fail(Reason::kTruncated,
         detail::concat(size, " bytes, shorter than the ", kHeaderBytes, "-byte header"));
  }
  MessageInfo info;
  info.version = bytes[4];
  if (info.version != kCodecVersion) {
    fail(Reason::kBadVersion, detail::concat("codec version ", int{info.version},
                                             ", this build reads version ", int{kCodecVersion}));
  }
  if (size < kHeaderBytes) {
    fail(Reason::kTruncated,
         detail::concat(size, " bytes, shorter than the ", kHeaderBytes, "-byte header"));
  }
  const uint32_t header_crc = load_le<uint32_t>(bytes + kHeaderCrcOffset);
  if (crc32_of(bytes, kHeaderCrcOffset) != header_crc) {
    fail(Reason::kBadChecksum, "header checksum mismatch (header corrupted)");
  }
  if (!known_value_type(bytes[5])) {
    fail(Reason::kMalformed, detail::concat("unknown value type ", int{bytes[5]}));
  }
  info.value_type = static_cast<ValueType>(bytes[5]);
  const uint16_t flags = load_le<uint16_t>(bytes + 6);
  if ((flags & ~kKnownFlags) != 0) {
    fail(Reason::kMalformed, detail::concat("unknown flags ", flags, " (known bits: ", kKnownFlags,
                                            "); is the sender a newer dgc version?"));
  }
  info.flags = flags;
  info.iteration = load_le<uint64_t>(bytes + 8);
  std::memcpy(info.run_id.data(), bytes + kRunIdOffset, kRunIdBytes);
  info.tensor_count = load_le<uint32_t>(bytes + 16);
  const bool tagged = (flags & kFlagTagged) != 0;
  if (expect != nullptr) {
    // Whose message is it? Checked before its length and tag: a stranger's message is named as
    // such, whatever else is wrong with it.
    if (info.run_id != expect->run_id) {
      fail(Reason::kForeignRun,
           detail::concat("from another job: run id ", to_hex(info.run_id), ", this job's is ",
                          to_hex(expect->run_id),
                          "; is another job (or an earlier attempt of this one) sending to this "
                          "rank's ports?"));
    }
    if (info.iteration != expect->iteration) {
      fail(Reason::kWrongIteration,
           detail::concat("for iteration ", info.iteration, " but this rank is at iteration ",
                          expect->iteration,
                          "; the ranks are out of step (or the message is "
                          "replayed)"));
    }
  }
  const uint32_t payload_bytes = load_le<uint32_t>(bytes + 20);
  const size_t trailer = tagged ? kTagBytes : 0;
  const size_t available = size - kHeaderBytes;
  if (available < payload_bytes + trailer) {
    fail(Reason::kTruncated,
         detail::concat("header announces ", payload_bytes, " payload bytes",
                        tagged ? " and a tag" : "", ", the message holds ", available));
  }
  if (available > payload_bytes + trailer) {
    fail(Reason::kMalformed, detail::concat(available - payload_bytes - trailer,
                                            " trailing bytes after the announced payload of ",
                                            payload_bytes, tagged ? " and the tag" : ""));
  }
  const uint8_t* payload = bytes + kHeaderBytes;
  if (crc32_of(payload, payload_bytes) != load_le<uint32_t>(bytes + 24)) {
    fail(Reason::kBadChecksum, "payload checksum mismatch (payload corrupted)");
  }
  if (expect != nullptr) {
    if (expect->authenticator == nullptr && tagged) {
      fail(Reason::kBadTag,
           "carries an authentication tag but this rank has no job secret; give every rank the "
           "same secret (DGC_JOB_SECRET or --job-secret-file) or none");
    }
    if (expect->authenticator != nullptr) {
      if (!tagged) {
        fail(Reason::kBadTag,
             "carries no authentication tag but this job has a secret: refused (a sender "
             "without the job secret is not a rank of this job)");
      }
      uint8_t route[8];
      store_le<uint32_t>(route, expect->route.sender);
      store_le<uint32_t>(route + 4, expect->route.receiver);
      const std::span<const uint8_t> signed_bytes(bytes, kHeaderBytes + payload_bytes);
      if (!expect->authenticator->verify({route, signed_bytes},
                                         message.subspan(kHeaderBytes + payload_bytes))) {
        fail(Reason::kBadTag,
             "authentication tag does not verify: the message was altered, replayed from "
             "another rank, or made without this job's secret; refused");
      }
    }
  }
  if (info.tensor_count > payload_bytes / 3) {  // every entry takes at least 3 bytes
    fail(Reason::kMalformed, detail::concat(info.tensor_count, " tensor entries cannot fit in ",
                                            payload_bytes, " payload bytes"));
  }

  const size_t width = value_bytes(info.value_type);
  Reader in(payload, payload + payload_bytes);
  for (uint32_t entry = 0; entry < info.tensor_count; ++entry) {
    const uint64_t id = in.varint(entry, "tensor id");
    if (id >= expected_numels.size()) {
      fail(Reason::kOutOfRange,
           detail::concat("tensor entry ", entry, ": tensor id ", id, ", the receiver has ",
                          expected_numels.size(), " compressed tensors"));
    }
    const uint64_t numel = in.varint(entry, "element count");
    if (numel != expected_numels[id]) {
      fail(Reason::kOutOfRange,
           detail::concat("tensor ", id, " has ", numel, " elements in the message, ",
                          expected_numels[id], " in the receiver's layout"));
    }
    const uint64_t count = in.varint(entry, "selected count");
    if (count > numel) {
      fail(Reason::kMalformed,
           detail::concat("tensor ", id, ": ", count, " selected elements out of ", numel));
    }
    // Indices: strictly increasing (gaps are >= 0 by construction) and < numel.
    uint64_t index = 0;
    for (uint64_t j = 0; j < count; ++j) {
      const uint64_t gap = in.varint(entry, "index gap");
      if (gap >= numel || (j > 0 && gap >= numel - index - 1)) {
        fail(Reason::kOutOfRange,
             detail::concat("tensor ", id, ": element ", j, " has index ",
                            j == 0 ? detail::concat(gap) : detail::concat(index, " + 1 + ", gap),
                            ", the tensor has ", numel, " elements"));
      }
      index = j == 0 ? gap : index + 1 + gap;
    }
    if (in.remaining() / width < count) {
      fail(Reason::kMalformed,
           detail::concat("tensor ", id, ": ", count, " values need ", count * width, " bytes, ",
                          in.remaining(), " are left"));
    }
    const uint8_t* values = in.position();
    in.skip(count * width);
    for (uint64_t j = 0; j < count; ++j) {
      const float value = load_value(values + j * width, info.value_type);
      if (!std::isfinite(value)) {
        fail(Reason::kMalformed,
             detail::concat("tensor ", id, ": element ", j, " has value ", value, " (",
                            to_string(info.value_type), "); values must be finite"));
      }
    }
    info.element_count += count;
  }
  if (in.remaining() != 0) {
    fail(Reason::kMalformed, detail::concat(in.remaining(), " payload bytes left after ",
                                            info.tensor_count, " tensor entries"));
  }
  return info;
}

}  // namespace

ValidatedMessage ValidatedMessage::validate(std::span<const uint8_t> message,
                                            std::span<const uint64_t> expected_numels,
                                            const MessageExpectation* expect) {
  const MessageInfo info = parse(message, expected_numels, expect);
  return ValidatedMessage(message, expected_numels, info);
}

MessageInfo validate_message(std::span<const uint8_t> message,
                             std::span<const uint64_t> expected_numels) {
  return parse(message, expected_numels, nullptr);
}

}  // namespace dgc
