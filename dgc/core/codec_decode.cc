// Decoding of a validated DGC message (codec.h): element by element, or added into the
// outputs.
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
