// The codec's names of the value types and its writer (codec.h); validation is in
// codec_validate.cc, decoding in codec_decode.cc.
#include "dgc/core/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "dgc/core/bytes.h"
#include "dgc/core/codec_format.h"
#include "dgc/core/crc32.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"

namespace dgc {

using namespace codec_format;

const char* to_string(ValueType type) { return name_of(kValueTypeNames, type); }

ValueType parse_value_type(std::string_view name) {
  return parse_name(kValueTypeNames, name, "value type");
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

}  // namespace dgc
