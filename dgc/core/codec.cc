#include "dgc/core/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "dgc/core/bytes.h"
#include "dgc/core/crc32.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"

namespace dgc {
namespace {

constexpr uint8_t kMagic[4] = {'D', 'G', 'C', '1'};
constexpr size_t kHeaderBytes = kMessageHeaderBytes;
constexpr size_t kRunIdOffset = 28;
constexpr size_t kHeaderCrcOffset = 44;  // the header crc covers bytes [0, 44)
size_t value_bytes(ValueType type) { return type == ValueType::kFloat32 ? 4 : 2; }

bool known_value_type(uint8_t type) { return type <= static_cast<uint8_t>(ValueType::kBFloat16); }

[[noreturn]] void fail(DecodeError::Reason reason, const std::string& what) {
  throw DecodeError(reason, "invalid DGC message: " + what);
}

float load_value(const uint8_t* p, ValueType type) {
  switch (type) {
    case ValueType::kFloat32:
      return std::bit_cast<float>(load_le<uint32_t>(p));
    case ValueType::kFloat16:
      return fp16_to_float(load_le<uint16_t>(p));
    case ValueType::kBFloat16:
      return bf16_to_float(load_le<uint16_t>(p));
  }
  return 0.0f;
}

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

// Walks a validated message tensor by tensor: decodes the tensor's indices into `indices` and
// calls sink(tensor_id, indices, values) with `values` pointing at its count encoded values.
template <typename TensorSink>
void walk_validated(const ValidatedMessage& message, std::vector<uint64_t>& indices,
                    const TensorSink& sink) {
  const MessageInfo& info = message.info();
  const size_t width = value_bytes(info.value_type);
  const uint8_t* p = message.bytes().data() + kHeaderBytes;
  for (uint32_t entry = 0; entry < info.tensor_count; ++entry) {
    const uint64_t id = get_varint_unchecked(p);
    get_varint_unchecked(p);  // numel: validation matched it to the layout
    const uint64_t count = get_varint_unchecked(p);
    indices.resize(count);
    uint64_t index = 0;
    for (uint64_t j = 0; j < count; ++j) {
      const uint64_t gap = get_varint_unchecked(p);
      index = j == 0 ? gap : index + 1 + gap;
      indices[j] = index;
    }
    sink(static_cast<uint32_t>(id), std::span<const uint64_t>(indices), p);
    p += count * width;
  }
}

inline void prefetch_for_write(const float* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, 1);
#else
  (void)address;
#endif
}

// out[indices[j]] += scale * load(j). The indices are scattered over a large buffer (one cache
// and TLB miss each), so the target of the addition kPrefetchAhead elements later is requested
// early.
template <typename Load>
void scatter_add(float* out, std::span<const uint64_t> indices, float scale, const Load& load) {
  constexpr size_t kPrefetchAhead = 16;
  const size_t count = indices.size();
  for (size_t j = 0; j < count; ++j) {
    if (j + kPrefetchAhead < count) prefetch_for_write(out + indices[j + kPrefetchAhead]);
    out[indices[j]] += scale * load(j);
  }
}

}  // namespace

const char* to_string(ValueType type) {
  switch (type) {
    case ValueType::kFloat32:
      return "fp32";
    case ValueType::kFloat16:
      return "fp16";
    case ValueType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

ValueType parse_value_type(std::string_view name) {
  if (name == "fp32") return ValueType::kFloat32;
  if (name == "fp16") return ValueType::kFloat16;
  if (name == "bf16") return ValueType::kBFloat16;
  throw InvalidArgument("unknown value type '" + std::string(name) +
                        "': expected fp32, fp16 or bf16");
}

MessageWriter::MessageWriter(ValueType value_type, uint64_t iteration, const RunId& run_id)
    : run_id_(run_id) {
  reset(value_type, iteration);
}

void MessageWriter::reset(ValueType value_type, uint64_t iteration) {
  DGC_CHECK(known_value_type(static_cast<uint8_t>(value_type)), "unknown value type ",
            static_cast<int>(value_type));
  value_type_ = value_type;
  iteration_ = iteration;
  flags_ = 0;
  tensor_count_ = 0;
  payload_.clear();
}

void MessageWriter::add(uint32_t tensor_id, uint64_t numel, std::span<const uint32_t> indices,
                        std::span<const float> values) {
  DGC_CHECK_EQ(indices.size(), values.size(), "one value per index");
  DGC_CHECK_LT(tensor_count_, std::numeric_limits<uint32_t>::max(), "too many tensors");
  const size_t count = indices.size();
  for (size_t j = 0; j < count; ++j) {
    DGC_CHECK_LT(uint64_t{indices[j]}, numel, "tensor ", tensor_id, ": index out of range");
    DGC_CHECK(j == 0 || indices[j] > indices[j - 1], "tensor ", tensor_id,
              ": indices must be strictly increasing, found ", indices[j - 1], " then ",
              indices[j]);
  }
  const size_t width = value_bytes(value_type_);
  const size_t old_size = payload_.size();
  payload_.resize(old_size + 3 * kMaxVarintBytes + count * (5 + width));
  uint8_t* p = payload_.data() + old_size;
  p = put_varint(p, tensor_id);
  p = put_varint(p, numel);
  p = put_varint(p, count);
  uint32_t previous = 0;
  for (size_t j = 0; j < count; ++j) {
    p = put_varint(p, j == 0 ? indices[0] : indices[j] - previous - 1);
    previous = indices[j];
  }
  switch (value_type_) {
    case ValueType::kFloat32:
      if constexpr (std::endian::native == std::endian::little) {
        // An empty selection may come with a null data pointer: memcpy must not see it.
        if (count > 0) std::memcpy(p, values.data(), count * 4);
      } else {
        for (size_t j = 0; j < count; ++j) store_le(p + 4 * j, std::bit_cast<uint32_t>(values[j]));
      }
      break;
    case ValueType::kFloat16:
      for (size_t j = 0; j < count; ++j) store_le(p + 2 * j, fp16_from_float(values[j]));
      break;
    case ValueType::kBFloat16:
      for (size_t j = 0; j < count; ++j) store_le(p + 2 * j, bf16_from_float(values[j]));
      break;
  }
  p += count * width;
  payload_.resize(static_cast<size_t>(p - payload_.data()));
  ++tensor_count_;
}

void MessageWriter::set_flags(uint16_t flags) {
  DGC_CHECK_EQ(flags & ~kKnownFlags, 0, "unknown message flags ", flags);
  DGC_CHECK_EQ(flags & kFlagTagged, 0, "kFlagTagged is set by finish() with an authenticator");
  flags_ = flags;
}

void MessageWriter::finish(std::vector<uint8_t>& out) { finish(out, 0, 0); }

void MessageWriter::finish(std::vector<uint8_t>& out, const MessageAuthenticator& auth,
                           MessageRoute route) {
  finish(out, kFlagTagged, kTagBytes);
  uint8_t route_bytes[8];
  store_le<uint32_t>(route_bytes, route.sender);
  store_le<uint32_t>(route_bytes + 4, route.receiver);
  const size_t signed_size = out.size() - kTagBytes;
  const Tag tag = auth.tag({route_bytes, std::span<const uint8_t>(out.data(), signed_size)});
  std::memcpy(out.data() + signed_size, tag.data(), kTagBytes);
}

void MessageWriter::finish(std::vector<uint8_t>& out, uint16_t extra_flags, size_t trailer_bytes) {
  DGC_CHECK_LE(payload_.size(), size_t{std::numeric_limits<uint32_t>::max()},
               "message payload too large for one message");
  out.clear();
  out.resize(kHeaderBytes + payload_.size() + trailer_bytes);
  uint8_t* h = out.data();
  std::memcpy(h, kMagic, 4);
  h[4] = kCodecVersion;
  h[5] = static_cast<uint8_t>(value_type_);
  store_le<uint16_t>(h + 6, static_cast<uint16_t>(flags_ | extra_flags));
  store_le<uint64_t>(h + 8, iteration_);
  store_le<uint32_t>(h + 16, tensor_count_);
  store_le<uint32_t>(h + 20, static_cast<uint32_t>(payload_.size()));
  store_le<uint32_t>(h + 24, crc32_of(payload_.data(), payload_.size()));
  std::memcpy(h + kRunIdOffset, run_id_.data(), kRunIdBytes);
  store_le<uint32_t>(h + kHeaderCrcOffset, crc32_of(h, kHeaderCrcOffset));
  if (!payload_.empty()) std::memcpy(h + kHeaderBytes, payload_.data(), payload_.size());
}

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

void for_each_element(const ValidatedMessage& message, const ElementVisitor& visit) {
  const ValueType type = message.info().value_type;
  const size_t width = value_bytes(type);
  std::vector<uint64_t> indices;
  walk_validated(message, indices,
                 [&](uint32_t id, std::span<const uint64_t> tensor_indices, const uint8_t* values) {
                   for (size_t j = 0; j < tensor_indices.size(); ++j) {
                     visit(id, tensor_indices[j], load_value(values + j * width, type));
                   }
                 });
}

MessageInfo decode_message(std::span<const uint8_t> message,
                           std::span<const uint64_t> expected_numels, const ElementVisitor& visit) {
  const auto validated = ValidatedMessage::validate(message, expected_numels);
  for_each_element(validated, visit);
  return validated.info();
}

MessageInfo decode_add(std::span<const uint8_t> message, std::span<const std::span<float>> outputs,
                       float scale) {
  std::vector<uint64_t> numels(outputs.size());
  for (size_t t = 0; t < outputs.size(); ++t) numels[t] = outputs[t].size();
  const auto validated = ValidatedMessage::validate(message, numels);
  decode_add(validated, outputs, scale);
  return validated.info();
}

void decode_add(const ValidatedMessage& message, std::span<const std::span<float>> outputs,
                float scale, std::span<std::vector<uint64_t>> written) {
  const auto numels = message.expected_numels();
  DGC_CHECK_EQ(outputs.size(), numels.size(),
               "one output per tensor of the layout the message was validated against");
  for (size_t t = 0; t < outputs.size(); ++t) {
    DGC_CHECK_EQ(uint64_t{outputs[t].size()}, numels[t], "output ", t,
                 " must have the numel the message was validated against");
  }
  DGC_CHECK(written.empty() || written.size() == outputs.size(),
            "`written` must be empty or hold one vector per output, found ", written.size(),
            " for ", outputs.size(), " outputs");
  const ValueType type = message.info().value_type;
  std::vector<uint64_t> indices;
  walk_validated(message, indices,
                 [&](uint32_t id, std::span<const uint64_t> tensor_indices, const uint8_t* values) {
                   float* out = outputs[id].data();
                   switch (type) {
                     case ValueType::kFloat32:
                       scatter_add(out, tensor_indices, scale, [values](size_t j) {
                         return std::bit_cast<float>(load_le<uint32_t>(values + 4 * j));
                       });
                       break;
                     case ValueType::kFloat16:
                       scatter_add(out, tensor_indices, scale, [values](size_t j) {
                         return fp16_to_float(load_le<uint16_t>(values + 2 * j));
                       });
                       break;
                     case ValueType::kBFloat16:
                       scatter_add(out, tensor_indices, scale, [values](size_t j) {
                         return bf16_to_float(load_le<uint16_t>(values + 2 * j));
                       });
                       break;
                   }
                   if (!written.empty()) {
                     written[id].insert(written[id].end(), tensor_indices.begin(),
                                        tensor_indices.end());
                   }
                 });
}

}  // namespace dgc
