// The wire codec (codec.h): round trips, and rejection of every malformed message without
// writing anything.
#include "dgc/core/codec.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/core/error.h"
#include "dgc/core/test/reference.h"

namespace dgc {

// Readable parameter names in test listings.
void PrintTo(ValueType type, std::ostream* os) {
  *os << (type == ValueType::kFloat32 ? "fp32" : type == ValueType::kFloat16 ? "fp16" : "bf16");
}

namespace {

using Reason = DecodeError::Reason;

// --- Hand-built messages, following the layout documented in codec.h -------------------------

void put_varint(std::vector<uint8_t>& out, uint64_t x) {
  while (x >= 0x80) {
    out.push_back(static_cast<uint8_t>(x) | 0x80);
    x >>= 7;
  }
  out.push_back(static_cast<uint8_t>(x));
}

template <typename T>
void put_le(std::vector<uint8_t>& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

uint32_t crc(const uint8_t* data, size_t size) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(size)));
}

std::vector<uint8_t> craft(const std::vector<uint8_t>& payload, uint32_t tensor_count,
                           uint8_t value_type = 0, uint8_t version = kCodecVersion,
                           uint16_t flags = 0) {
  std::vector<uint8_t> m = {'D', 'G', 'C', '1', version, value_type};
  put_le<uint16_t>(m, flags);
  put_le<uint64_t>(m, 42);
  put_le<uint32_t>(m, tensor_count);
  put_le<uint32_t>(m, static_cast<uint32_t>(payload.size()));
  put_le<uint32_t>(m, crc(payload.data(), payload.size()));
  m.insert(m.end(), kRunIdBytes, 0);  // run id: all zero
  put_le<uint32_t>(m, crc(m.data(), 44));
  m.insert(m.end(), payload.begin(), payload.end());
  return m;
}

// Recomputes both checksums after a deliberate edit.
void fix_checksums(std::vector<uint8_t>& m) {
  const uint32_t payload_crc = crc(m.data() + 48, m.size() - 48);
  std::memcpy(m.data() + 24, &payload_crc, 4);
  const uint32_t header_crc = crc(m.data(), 44);
  std::memcpy(m.data() + 44, &header_crc, 4);
}

// One fp32 tensor entry: id, numel, then the given raw indices (as gaps) and values.
std::vector<uint8_t> entry(uint64_t id, uint64_t numel, const std::vector<uint64_t>& gaps,
                           const std::vector<float>& values) {
  std::vector<uint8_t> out;
  put_varint(out, id);
  put_varint(out, numel);
  put_varint(out, gaps.size());
  for (uint64_t gap : gaps) put_varint(out, gap);
  for (float value : values) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    put_le<uint32_t>(out, bits);
  }
  return out;
}

// --- Helpers ----------------------------------------------------------------------------------

// Output buffers with guard zones on both sides, to see any write outside the tensors.
struct GuardedOutputs {
  static constexpr size_t kGuard = 64;
  static constexpr float kCanary = 12345.0f;
  std::vector<std::vector<float>> storage;
  std::vector<std::span<float>> spans;
  explicit GuardedOutputs(const std::vector<size_t>& numels) {
    for (size_t n : numels) storage.emplace_back(n + 2 * kGuard, kCanary);
    for (size_t t = 0; t < numels.size(); ++t) {
      spans.emplace_back(storage[t].data() + kGuard, numels[t]);
    }
  }
  // True if nothing at all was written (every float, guards included, is the canary).
  bool untouched() const {
    for (const auto& s : storage) {
      for (float x : s) {
        if (x != kCanary) return false;
      }
    }
    return true;
  }
  bool guards_intact() const {
    for (const auto& s : storage) {
      for (size_t i = 0; i < kGuard; ++i) {
        if (s[i] != kCanary || s[s.size() - 1 - i] != kCanary) return false;
      }
    }
    return true;
  }
};

Reason reason_of(std::span<const uint8_t> message, const std::vector<size_t>& numels) {
  GuardedOutputs out(numels);
  try {
    decode_add(message, out.spans, 1.0f);
  } catch (const DecodeError& e) {
    EXPECT_TRUE(out.untouched()) << "an invalid message wrote into the outputs";
    return e.reason();
  }
  ADD_FAILURE() << "message accepted";
  return Reason::kMalformed;
}

struct Tensor {
  uint32_t id;
  uint64_t numel;
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

std::vector<uint8_t> encode(const std::vector<Tensor>& tensors, ValueType type,
                            uint64_t iteration = 7) {
  MessageWriter writer(type, iteration);
  for (const Tensor& t : tensors) writer.add(t.id, t.numel, t.indices, t.values);
  std::vector<uint8_t> out;
  writer.finish(out);
  return out;
}

Tensor random_tensor(uint32_t id, uint64_t numel, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v = test::normal_values(numel, seed);
  Selection s;
  select_exact(v, count, s);
  return {id, numel, s.indices, s.values};
}

// A small valid message used by the corruption tests.
std::vector<uint8_t> small_message(ValueType type = ValueType::kFloat32) {
  return encode(
      {random_tensor(0, 100, 5, 1), random_tensor(1, 50, 0, 2), random_tensor(2, 3000, 4, 3)},
      type);
}
const std::vector<size_t> kSmallLayout = {100, 50, 3000};

// --- Round trips ------------------------------------------------------------------------------

class RoundTripTest : public ::testing::TestWithParam<ValueType> {};

TEST_P(RoundTripTest, DecodeAddReproducesTheSelection) {
  const ValueType type = GetParam();
  const std::vector<Tensor> tensors = {random_tensor(0, 1000, 10, 1), random_tensor(1, 1, 1, 2),
                                       random_tensor(2, 0, 0, 3), random_tensor(3, 20000, 0, 4),
                                       random_tensor(4, 100000, 100, 5)};
  const std::vector<uint8_t> m = encode(tensors, type, 123456789012ULL);
  const std::vector<size_t> layout = {1000, 1, 0, 20000, 100000};
  GuardedOutputs out(layout);
  for (auto& s : out.storage)
    std::fill(s.begin() + GuardedOutputs::kGuard, s.end() - GuardedOutputs::kGuard, 1.0f);
  const MessageInfo info = decode_add(m, out.spans, 0.5f);
  EXPECT_EQ(info.version, kCodecVersion);
  EXPECT_EQ(info.value_type, type);
  EXPECT_EQ(info.iteration, 123456789012ULL);
  EXPECT_EQ(info.tensor_count, 5u);
  EXPECT_EQ(info.element_count, 111u);
  EXPECT_TRUE(out.guards_intact());
  for (const Tensor& t : tensors) {
    std::vector<float> expected(t.numel, 1.0f);
    for (size_t j = 0; j < t.indices.size(); ++j) {
      expected[t.indices[j]] += 0.5f * round_to(t.values[j], type);
    }
    const auto got = out.spans[t.id];
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin(), expected.end())) << t.id;
  }
  // validate_message agrees and decode_message visits the same elements in order.
  const std::vector<uint64_t> numels(layout.begin(), layout.end());
  EXPECT_EQ(validate_message(m, numels).element_count, 111u);
  std::vector<std::tuple<uint32_t, uint64_t, float>> visited;
  decode_message(m, numels, [&](uint32_t id, uint64_t index, float value) {
    visited.emplace_back(id, index, value);
  });
  size_t at = 0;
  for (const Tensor& t : tensors) {
    for (size_t j = 0; j < t.indices.size(); ++j, ++at) {
      ASSERT_LT(at, visited.size());
      EXPECT_EQ(visited[at],
                std::make_tuple(t.id, uint64_t{t.indices[j]}, round_to(t.values[j], type)));
    }
  }
  EXPECT_EQ(at, visited.size());
}

INSTANTIATE_TEST_SUITE_P(ValueTypes, RoundTripTest,
                         ::testing::Values(ValueType::kFloat32, ValueType::kFloat16,
                                           ValueType::kBFloat16));

// The validated path (ValidatedMessage::validate, then decode_add of it) gives the same bits as
// decode_add of the bytes and reports every written position in message order.
TEST_P(RoundTripTest, ValidatedMessageAppliesLikeDecodeAdd) {
  const ValueType type = GetParam();
  const std::vector<Tensor> tensors = {random_tensor(0, 1000, 10, 11), random_tensor(1, 1, 1, 12),
                                       random_tensor(3, 20000, 0, 14),
                                       random_tensor(4, 100000, 100, 15)};
  const std::vector<uint8_t> m = encode(tensors, type, 7);
  const std::vector<size_t> layout = {1000, 1, 5, 20000, 100000};
  const std::vector<uint64_t> numels(layout.begin(), layout.end());
  GuardedOutputs direct(layout), applied(layout);
  for (auto* out : {&direct, &applied}) {
    for (auto& s : out->spans) std::fill(s.begin(), s.end(), 0.25f);
  }
  decode_add(m, direct.spans, 0.5f);
  const auto validated = ValidatedMessage::validate(m, numels);
  EXPECT_EQ(validated.info().element_count, 111u);
  EXPECT_EQ(validated.info().iteration, 7u);
  std::vector<std::vector<uint64_t>> written(layout.size());
  written[4].push_back(17);  // appended to, not replaced
  decode_add(validated, applied.spans, 0.5f, written);
  EXPECT_TRUE(applied.guards_intact());
  for (size_t t = 0; t < layout.size(); ++t) {
    EXPECT_TRUE(std::equal(direct.spans[t].begin(), direct.spans[t].end(), applied.spans[t].begin(),
                           applied.spans[t].end()))
        << t;
  }
  std::vector<std::vector<uint64_t>> expected_written(layout.size());
  expected_written[4].push_back(17);
  for (const Tensor& t : tensors) {
    expected_written[t.id].insert(expected_written[t.id].end(), t.indices.begin(), t.indices.end());
  }
  EXPECT_EQ(written, expected_written);
}

TEST(Codec, ValidatedMessageRejectsWhatValidateMessageRejects) {
  std::vector<uint8_t> m = small_message();
  const std::vector<uint64_t> numels(kSmallLayout.begin(), kSmallLayout.end());
  EXPECT_NO_THROW(ValidatedMessage::validate(m, numels));
  m[kMessageHeaderBytes + 8] ^= 0x5A;  // payload corrupted: the checksum catches it
  try {
    ValidatedMessage::validate(m, numels);
    FAIL() << "a corrupted message was accepted";
  } catch (const DecodeError& e) {
    EXPECT_EQ(e.reason(), Reason::kBadChecksum);
  }
  m[kMessageHeaderBytes + 8] ^= 0x5A;
  const std::vector<uint64_t> other = {100, 50, 2999};
  EXPECT_THROW(ValidatedMessage::validate(m, other), DecodeError);
}

TEST(Codec, ValidatedMessageChecksTheOutputsAgainstItsLayout) {
  const std::vector<uint8_t> m = small_message();
  const std::vector<uint64_t> numels(kSmallLayout.begin(), kSmallLayout.end());
  const auto validated = ValidatedMessage::validate(m, numels);
  // One output too small, one output missing, `written` of the wrong size: nothing is written.
  GuardedOutputs smaller({100, 50, 2999});
  EXPECT_THROW(decode_add(validated, smaller.spans, 1.0f), Error);
  EXPECT_TRUE(smaller.untouched());
  GuardedOutputs fewer({100, 50});
  EXPECT_THROW(decode_add(validated, fewer.spans, 1.0f), Error);
  EXPECT_TRUE(fewer.untouched());
  GuardedOutputs right(kSmallLayout);
  std::vector<std::vector<uint64_t>> written(2);
  EXPECT_THROW(decode_add(validated, right.spans, 1.0f, written), Error);
  EXPECT_TRUE(right.untouched());
}

TEST(Codec, EmptyMessageAndEmptyTensors) {
  const std::vector<uint8_t> empty = encode({}, ValueType::kFloat32);
  EXPECT_EQ(empty.size(), kMessageHeaderBytes);
  EXPECT_EQ(validate_message(empty, std::vector<uint64_t>{}).tensor_count, 0u);
  const std::vector<uint8_t> m = encode({{0, 0, {}, {}}, {1, 10, {}, {}}}, ValueType::kFloat16);
  GuardedOutputs out({0, 10});
  const MessageInfo info = decode_add(m, out.spans, 1.0f);
  EXPECT_EQ(info.tensor_count, 2u);
  EXPECT_EQ(info.element_count, 0u);
  EXPECT_TRUE(out.untouched());
}

// An empty fp32 selection has no storage (null data pointers): the writer must not hand them to
// memcpy (UBSan: "null pointer passed as argument"), and the entry still travels.
TEST(Codec, EmptySelectionWithNullStorage) {
  for (const ValueType type : {ValueType::kFloat32, ValueType::kFloat16, ValueType::kBFloat16}) {
    const std::vector<uint32_t> no_indices;
    const std::vector<float> no_values;
    ASSERT_EQ(no_values.data(), nullptr);
    MessageWriter writer(type, 3);
    writer.add(0, 100, no_indices, no_values);
    writer.add(1, 10, std::span<const uint32_t>(), std::span<const float>());
    std::vector<uint8_t> m;
    writer.finish(m);
    GuardedOutputs out({100, 10});
    const MessageInfo info = decode_add(m, out.spans, 1.0f);
    EXPECT_EQ(info.tensor_count, 2u);
    EXPECT_EQ(info.element_count, 0u);
    EXPECT_TRUE(out.untouched());
  }
}

TEST(Codec, BadGradientFlagTravelsInTheCheckedHeader) {
  MessageWriter writer(ValueType::kFloat32, 9);
  writer.add(0, 10, std::vector<uint32_t>{2}, std::vector<float>{1.0f});
  std::vector<uint8_t> plain, flagged;
  writer.finish(plain);
  writer.set_flags(kFlagBadGradient);
  writer.finish(flagged);
  EXPECT_EQ(validate_message(plain, std::vector<uint64_t>{10}).flags, 0);
  EXPECT_EQ(validate_message(flagged, std::vector<uint64_t>{10}).flags, kFlagBadGradient);
  // The flag is covered by the header checksum: flipping it in transit is detected.
  std::vector<uint8_t> flipped = plain;
  flipped[6] ^= kFlagBadGradient;
  EXPECT_EQ(reason_of(flipped, {10}), Reason::kBadChecksum);
  // reset() clears it; unknown bits are refused by the writer too.
  writer.reset(ValueType::kFloat32, 10);
  writer.finish(plain);
  EXPECT_EQ(validate_message(plain, std::vector<uint64_t>{}).flags, 0);
  EXPECT_THROW(writer.set_flags(2), Error);
}

TEST(Codec, FirstAndLastIndex) {
  const std::vector<uint8_t> m =
      encode({{0, 1000, {0, 999}, {1.0f, -2.0f}}, {1, 1, {0}, {3.0f}}}, ValueType::kFloat32);
  GuardedOutputs out({1000, 1});
  for (auto& s : out.spans) std::fill(s.begin(), s.end(), 0.0f);
  decode_add(m, out.spans, 1.0f);
  EXPECT_EQ(out.spans[0][0], 1.0f);
  EXPECT_EQ(out.spans[0][999], -2.0f);
  EXPECT_EQ(out.spans[1][0], 3.0f);
  EXPECT_TRUE(out.guards_intact());
}

TEST(Codec, GapsAboveTwoToThe28th) {
  // A declared numel of 2^33: decode with a visitor, nothing that large is allocated.
  const uint64_t numel = uint64_t{1} << 33;
  const std::vector<uint32_t> indices = {5, (1u << 29) + 7, (1u << 31) + 3, 0xFFFFFFFFu};
  const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<uint8_t> m = encode({{0, numel, indices, values}}, ValueType::kFloat32);
  const std::vector<uint64_t> layout = {numel};
  std::vector<uint64_t> seen;
  decode_message(m, layout, [&](uint32_t id, uint64_t index, float value) {
    EXPECT_EQ(id, 0u);
    EXPECT_EQ(value, values[seen.size()]);
    seen.push_back(index);
  });
  EXPECT_EQ(seen, std::vector<uint64_t>(indices.begin(), indices.end()));
}

TEST(Codec, BytesPerElementAtDensityOneInAThousand) {
  // d = 0.001: gaps average 1000, two varint bytes; plus the value.
  const size_t numel = 2000000;
  const size_t k = target_count(numel, 0.001);
  const Tensor t = random_tensor(0, numel, k, 9);
  const double fp32 = static_cast<double>(encode({t}, ValueType::kFloat32).size()) / k;
  const double fp16 = static_cast<double>(encode({t}, ValueType::kFloat16).size()) / k;
  EXPECT_LE(fp32, 6.5);
  EXPECT_LE(fp16, 4.5);
  RecordProperty("bytes_per_element_fp32", std::to_string(fp32));
  RecordProperty("bytes_per_element_fp16", std::to_string(fp16));
}

TEST(Codec, WriterRejectsBadInput) {
  MessageWriter writer(ValueType::kFloat32, 0);
  const std::vector<float> two = {1.0f, 2.0f};
  const std::vector<uint32_t> unsorted = {5, 3}, duplicate = {3, 3}, beyond = {3, 10};
  EXPECT_THROW(writer.add(0, 10, unsorted, two), InvalidArgument);
  EXPECT_THROW(writer.add(0, 10, duplicate, two), InvalidArgument);
  EXPECT_THROW(writer.add(0, 10, beyond, two), InvalidArgument);
  const std::vector<uint32_t> one = {1};
  EXPECT_THROW(writer.add(0, 10, one, two), InvalidArgument);
  // A rejected add leaves the writer as it was.
  std::vector<uint8_t> m;
  writer.finish(m);
  EXPECT_EQ(validate_message(m, std::vector<uint64_t>{}).tensor_count, 0u);
  EXPECT_THROW(MessageWriter(static_cast<ValueType>(7), 0), InvalidArgument);
}

TEST(Codec, WriterIsReusableAfterReset) {
  MessageWriter writer(ValueType::kFloat32, 1);
  const std::vector<uint32_t> idx = {2};
  const std::vector<float> val = {1.0f};
  writer.add(0, 10, idx, val);
  std::vector<uint8_t> first, second;
  writer.finish(first);
  writer.reset(ValueType::kFloat32, 1);
  writer.add(0, 10, idx, val);
  writer.finish(second);
  EXPECT_EQ(first, second);
}

// --- Rejection --------------------------------------------------------------------------------

TEST(Codec, EverySingleByteCorruptionIsRejected) {
  for (ValueType type : {ValueType::kFloat32, ValueType::kFloat16}) {
    const std::vector<uint8_t> valid = small_message(type);
    for (size_t at = 0; at < valid.size(); ++at) {
      for (uint8_t flip : {0x01, 0x80, 0xFF}) {
        std::vector<uint8_t> m = valid;
        m[at] ^= flip;
        const Reason reason = reason_of(m, kSmallLayout);
        if (at < 4) {
          EXPECT_EQ(reason, Reason::kBadMagic) << at;
        } else if (at == 4) {
          EXPECT_EQ(reason, Reason::kBadVersion) << at;
        } else {
          EXPECT_EQ(reason, Reason::kBadChecksum) << at;
        }
      }
    }
  }
}

TEST(Codec, EveryTruncationIsRejected) {
  const std::vector<uint8_t> valid = small_message();
  for (size_t size = 0; size < valid.size(); ++size) {
    EXPECT_EQ(reason_of(std::span<const uint8_t>(valid.data(), size), kSmallLayout),
              Reason::kTruncated)
        << size;
  }
  std::vector<uint8_t> longer = valid;
  longer.push_back(0);
  EXPECT_EQ(reason_of(longer, kSmallLayout), Reason::kMalformed);
}

TEST(Codec, WrongVersionIsRejected) {
  // Version 1 (no run id) is no longer read.
  const std::vector<uint8_t> m = craft(entry(0, 10, {1}, {1.0f}), 1, 0, /*version=*/1);
  EXPECT_EQ(reason_of(m, {10}), Reason::kBadVersion);
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {1.0f}), 1, 0, /*version=*/3), {10}),
            Reason::kBadVersion);
  EXPECT_EQ(reason_of(craft({}, 0, 0, 0), {}), Reason::kBadVersion);
}

TEST(Codec, OutOfRangeAgainstTheReceiversLayoutIsRejected) {
  // Tensor id beyond the layout.
  EXPECT_EQ(reason_of(craft(entry(3, 10, {1}, {1.0f}), 1), {10, 10, 10}), Reason::kOutOfRange);
  // Numel that differs from the layout.
  EXPECT_EQ(reason_of(craft(entry(0, 11, {1}, {1.0f}), 1), {10}), Reason::kOutOfRange);
  // An index at numel (first index, and via a gap).
  EXPECT_EQ(reason_of(craft(entry(0, 10, {10}, {1.0f}), 1), {10}), Reason::kOutOfRange);
  EXPECT_EQ(reason_of(craft(entry(0, 10, {2, 7}, {1.0f, 1.0f}), 1), {10}), Reason::kOutOfRange);
  // A gap that would overflow 64 bits.
  EXPECT_EQ(reason_of(craft(entry(0, 10, {2, ~uint64_t{0}}, {1.0f, 1.0f}), 1), {10}),
            Reason::kOutOfRange);
  // The same message is fine against a layout that fits: the last index is 9.
  GuardedOutputs ok({10});
  EXPECT_NO_THROW(decode_add(craft(entry(0, 10, {2, 6}, {1.0f, 1.0f}), 1), ok.spans, 1.0f));
  // And a message whose first tensor is fine but whose second is out of range writes nothing.
  std::vector<uint8_t> payload = entry(0, 10, {1}, {1.0f});
  const std::vector<uint8_t> bad = entry(1, 5, {5}, {1.0f});
  payload.insert(payload.end(), bad.begin(), bad.end());
  EXPECT_EQ(reason_of(craft(payload, 2), {10, 5}), Reason::kOutOfRange);
}

TEST(Codec, MalformedPayloadsAreRejected) {
  // Each payload has a valid header and checksums; the content is wrong.
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {1.0f}), 2), {10, 10}), Reason::kMalformed)
      << "fewer entries than announced";
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {}), 1), {10}), Reason::kMalformed)
      << "values missing";
  std::vector<uint8_t> extra = entry(0, 10, {1}, {1.0f});
  extra.push_back(0);
  EXPECT_EQ(reason_of(craft(extra, 1), {10}), Reason::kMalformed) << "trailing payload";
  EXPECT_EQ(reason_of(craft({0x80, 0x00, 0x0A, 0x00}, 1), {10}), Reason::kMalformed)
      << "overlong varint";
  EXPECT_EQ(reason_of(craft({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, 10, 0}, 1),
                      {10}),
            Reason::kMalformed)
      << "varint over 64 bits";
  EXPECT_EQ(reason_of(craft({0x00, 0x0A, 0x80}, 1), {10}), Reason::kMalformed)
      << "varint cut by the payload end";
  EXPECT_EQ(reason_of(craft(entry(0, 2, {0, 0, 0}, {1.0f, 1.0f, 1.0f}), 1), {2}),
            Reason::kMalformed)
      << "more elements than the tensor";
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {std::numeric_limits<float>::quiet_NaN()}), 1), {10}),
            Reason::kMalformed)
      << "NaN value";
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {std::numeric_limits<float>::infinity()}), 1), {10}),
            Reason::kMalformed)
      << "infinite value";
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {1.0f}), 1, /*value_type=*/3), {10}),
            Reason::kMalformed)
      << "unknown value type";
  EXPECT_EQ(reason_of(craft(entry(0, 10, {1}, {1.0f}), 1, 0, kCodecVersion, /*flags=*/4), {10}),
            Reason::kMalformed)
      << "unknown flags";
  EXPECT_EQ(reason_of(craft({}, 1000000), {10}), Reason::kMalformed) << "absurd tensor count";
  // Wrong magic with a plausible rest.
  std::vector<uint8_t> m = craft(entry(0, 10, {1}, {1.0f}), 1);
  m[0] = 'X';
  EXPECT_EQ(reason_of(m, {10}), Reason::kBadMagic);
}

TEST(Codec, ErrorMessagesSayWhatWasWrong) {
  try {
    validate_message(craft(entry(4, 10, {1}, {1.0f}), 1), std::vector<uint64_t>{10, 10});
    FAIL();
  } catch (const DecodeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tensor id 4"), std::string::npos) << what;
    EXPECT_NE(what.find("2 compressed tensors"), std::string::npos) << what;
  }
}

// --- Fuzzing (seeded) -------------------------------------------------------------------------

TEST(CodecFuzz, RandomBytesNeverCrashOrWrite) {
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> m(static_cast<size_t>(rng() % 200));
    for (uint8_t& b : m) b = static_cast<uint8_t>(byte(rng));
    if (i % 2 == 0 && m.size() >= 4) std::memcpy(m.data(), "DGC1", 4);
    if (i % 4 == 0 && m.size() >= 5) m[4] = kCodecVersion;
    GuardedOutputs out({100, 7});
    EXPECT_THROW(decode_add(m, out.spans, 1.0f), DecodeError);
    ASSERT_TRUE(out.untouched());
  }
}

TEST(CodecFuzz, RandomPayloadsBehindAValidHeader) {
  // Valid header and checksums around random bytes: the parser itself is exercised.
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int> byte(0, 255);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> payload(static_cast<size_t>(rng() % 64));
    for (uint8_t& b : payload) b = static_cast<uint8_t>(byte(rng) & (i % 3 == 0 ? 0x0F : 0xFF));
    const uint32_t count = static_cast<uint32_t>(rng() % 4);
    const uint8_t type = static_cast<uint8_t>(rng() % 3);
    GuardedOutputs out({16, 1, 200});
    try {
      decode_add(craft(payload, count, type), out.spans, 1.0f);
      ++accepted;
      ASSERT_TRUE(out.guards_intact());
    } catch (const DecodeError&) {
      ASSERT_TRUE(out.untouched());
    }
  }
  RecordProperty("accepted", accepted);
  EXPECT_GT(accepted, 0) << "the parser accepted no random payload: the fuzz is too weak";
  EXPECT_LT(accepted, 20000);
}

TEST(CodecFuzz, MutatedValidMessagesWithFixedChecksums) {
  std::mt19937_64 rng(99);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const ValueType type = static_cast<ValueType>(i % 3);
    std::vector<uint8_t> m = small_message(type);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = 48 + static_cast<size_t>(rng() % (m.size() - 48));
      m[at] = static_cast<uint8_t>(rng());
    }
    if (i % 5 == 0) m.resize(48 + static_cast<size_t>(rng() % (m.size() - 47)));
    const uint32_t payload_bytes = static_cast<uint32_t>(m.size() - 48);
    std::memcpy(m.data() + 20, &payload_bytes, 4);
    fix_checksums(m);
    GuardedOutputs out(kSmallLayout);
    try {
      decode_add(m, out.spans, 1.0f);
      ++accepted;
      ASSERT_TRUE(out.guards_intact());
    } catch (const DecodeError& e) {
      ASSERT_TRUE(out.untouched());
      ASSERT_TRUE(e.reason() == Reason::kMalformed || e.reason() == Reason::kOutOfRange)
          << e.what();
    }
  }
  RecordProperty("accepted", accepted);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 20000);
}

// --- Job identity and authentication ----------------------------------------------------------

RunId run_id_of(uint8_t seed) {
  RunId id{};
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(seed + 7 * i);
  return id;
}

MacKey key_of(uint8_t seed) {
  MacKey key{};
  key.fill(seed);
  return key;
}

// A small message of job `run`, iteration `iteration`; tagged for `route` when `auth` is given.
std::vector<uint8_t> job_message(const RunId& run, uint64_t iteration,
                                 const MessageAuthenticator* auth = nullptr,
                                 MessageRoute route = {}) {
  MessageWriter writer(ValueType::kFloat32, iteration, run);
  writer.add(0, 100, std::vector<uint32_t>{3, 50}, std::vector<float>{1.0f, -2.0f});
  writer.add(2, 3000, std::vector<uint32_t>{2999}, std::vector<float>{0.5f});
  std::vector<uint8_t> m;
  if (auth != nullptr) {
    writer.finish(m, *auth, route);
  } else {
    writer.finish(m);
  }
  return m;
}

// Validates against an expectation into guarded outputs; returns the reason of the refusal
// (after checking that nothing was written), or nullopt if accepted.
std::optional<Reason> refusal(const std::vector<uint8_t>& m, const MessageExpectation& expect,
                              std::string* what = nullptr) {
  GuardedOutputs out(kSmallLayout);
  const std::vector<uint64_t> numels(kSmallLayout.begin(), kSmallLayout.end());
  try {
    const auto validated = ValidatedMessage::validate(m, numels, &expect);
    decode_add(validated, out.spans, 1.0f);
    EXPECT_TRUE(out.guards_intact());
    return std::nullopt;
  } catch (const DecodeError& e) {
    EXPECT_TRUE(out.untouched()) << "a refused message wrote into the outputs";
    if (what != nullptr) *what = e.what();
    return e.reason();
  }
}

TEST(CodecIdentity, TheRunIdAndIterationTravelInTheHeader) {
  const auto m = job_message(run_id_of(1), 77);
  EXPECT_EQ(m.size(), kMessageHeaderBytes + 13u + 10u);  // two entries: 13 and 10 bytes
  const MessageInfo info =
      validate_message(m, std::vector<uint64_t>(kSmallLayout.begin(), kSmallLayout.end()));
  EXPECT_EQ(info.run_id, run_id_of(1));
  EXPECT_EQ(info.iteration, 77u);
  EXPECT_EQ(info.flags & kFlagTagged, 0);
}

TEST(CodecIdentity, AMessageOfAnotherJobIsRefusedAndNothingWritten) {
  MessageExpectation expect{run_id_of(1), 5, nullptr, {}};
  EXPECT_EQ(refusal(job_message(run_id_of(1), 5), expect), std::nullopt);
  std::string what;
  EXPECT_EQ(refusal(job_message(run_id_of(2), 5), expect, &what), Reason::kForeignRun);
  EXPECT_NE(what.find("another job"), std::string::npos) << what;
  EXPECT_NE(what.find(to_hex(run_id_of(2))), std::string::npos) << what;
}

TEST(CodecIdentity, AMessageOfAnotherIterationIsRefusedAndNothingWritten) {
  MessageExpectation expect{run_id_of(1), 5, nullptr, {}};
  std::string what;
  EXPECT_EQ(refusal(job_message(run_id_of(1), 4), expect, &what), Reason::kWrongIteration);
  EXPECT_NE(what.find("iteration 4"), std::string::npos) << what;
  EXPECT_EQ(refusal(job_message(run_id_of(1), 6), expect), Reason::kWrongIteration);
}

TEST(CodecIdentity, WithASecretOnlyAValidTagForThisRouteIsAccepted) {
  const MessageAuthenticator auth(key_of(9));
  const MessageAuthenticator stranger(key_of(10));
  const MessageRoute route{3, kEveryRank};
  MessageExpectation expect{run_id_of(1), 5, &auth, route};
  const auto good = job_message(run_id_of(1), 5, &auth, route);
  EXPECT_EQ(good.size(), job_message(run_id_of(1), 5).size() + kTagBytes);
  EXPECT_EQ(refusal(good, expect), std::nullopt);

  std::string what;
  EXPECT_EQ(refusal(job_message(run_id_of(1), 5), expect, &what), Reason::kBadTag) << "untagged";
  EXPECT_NE(what.find("no authentication tag"), std::string::npos) << what;
  EXPECT_EQ(refusal(job_message(run_id_of(1), 5, &stranger, route), expect, &what), Reason::kBadTag)
      << "another key";
  EXPECT_NE(what.find("does not verify"), std::string::npos) << what;
  EXPECT_EQ(refusal(job_message(run_id_of(1), 5, &auth, {4, kEveryRank}), expect), Reason::kBadTag)
      << "replayed from another sender";
  EXPECT_EQ(refusal(job_message(run_id_of(1), 5, &auth, {3, 0}), expect), Reason::kBadTag)
      << "meant for another receiver";
  // Every single-bit change of the tag, and of the payload with both checksums repaired (what a
  // forger who knows the format but not the key can do), is refused.
  for (size_t at = kMessageHeaderBytes; at < good.size(); ++at) {
    std::vector<uint8_t> m = good;
    m[at] ^= 0x01;
    if (at < good.size() - kTagBytes) {
      const size_t payload = good.size() - kMessageHeaderBytes - kTagBytes;
      const uint32_t payload_crc = crc(m.data() + kMessageHeaderBytes, payload);
      std::memcpy(m.data() + 24, &payload_crc, 4);
      const uint32_t header_crc = crc(m.data(), 44);
      std::memcpy(m.data() + 44, &header_crc, 4);
    }
    EXPECT_EQ(refusal(m, expect), Reason::kBadTag) << at;
  }
  // A tag stripped off (flag cleared, checksums repaired) is an untagged message: refused.
  std::vector<uint8_t> stripped(good.begin(), good.end() - kTagBytes);
  stripped[6] &= static_cast<uint8_t>(~kFlagTagged);
  const uint32_t header_crc = crc(stripped.data(), 44);
  std::memcpy(stripped.data() + 44, &header_crc, 4);
  EXPECT_EQ(refusal(stripped, expect), Reason::kBadTag);
}

TEST(CodecIdentity, ATaggedMessageIsRefusedByAReceiverWithoutASecret) {
  const MessageAuthenticator auth(key_of(9));
  MessageExpectation expect{run_id_of(1), 5, nullptr, {}};
  std::string what;
  EXPECT_EQ(refusal(job_message(run_id_of(1), 5, &auth, {}), expect, &what), Reason::kBadTag);
  EXPECT_NE(what.find("no job secret"), std::string::npos) << what;
  // Without an expectation (tools outside a job) the tag is skipped, the rest validated.
  const auto m = job_message(run_id_of(1), 5, &auth, {});
  EXPECT_NE(
      validate_message(m, std::vector<uint64_t>(kSmallLayout.begin(), kSmallLayout.end())).flags &
          kFlagTagged,
      0);
}

TEST(CodecIdentity, TheTaggedFlagIsTheWritersOwn) {
  MessageWriter writer(ValueType::kFloat32, 1);
  EXPECT_THROW(writer.set_flags(kFlagTagged), InvalidArgument);
}

}  // namespace
}  // namespace dgc
