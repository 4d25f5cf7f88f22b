// The wire decoder (dgc/core/codec.h) on messages from a peer.
//
// Input: one byte of options, then the message. Option bit 0 set: the checksums, the payload
// length and (for a tagged message) the tag under the fuzz key are recomputed before decoding,
// so that mutations reach the payload parser instead of stopping at the checksum. Bits 1-2: the
// receiver's layout (one of four). Bit 3: validated with an expectation (run id all zero, the
// header's iteration, the fuzz key, sender 1 to every rank), as the exchange does under a job
// secret.
//
// Promises checked: validation throws nothing but dgc::DecodeError; an accepted message's
// elements are inside the layout, strictly increasing per tensor entry, finite, and as many as
// MessageInfo::element_count says; decode_add adds exactly what the element visitor reports
// (same order, bitwise); re-encoding the decoded entries with MessageWriter gives the same bytes
// (the encoding is canonical, the tag included).
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "dgc/core/bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "fuzz/fuzz_check.h"

namespace {

using dgc::DecodeError;
using dgc::ValidatedMessage;

uint32_t crc(const uint8_t* data, size_t size) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(size)));
}

const dgc::MessageAuthenticator& fuzz_key() {
  static const dgc::MessageAuthenticator auth = [] {
    dgc::MacKey key{};
    key.fill(0x42);
    return dgc::MessageAuthenticator(key);
  }();
  return auth;
}
constexpr dgc::MessageRoute kRoute{1, dgc::kEveryRank};

// Header fields (codec.h): flags at 6, payload_bytes at 20, payload crc at 24, header crc at 44
// over [0, 44); a tagged message ends with the tag of route | header | payload.
void fix_header(std::vector<uint8_t>& message) {
  const size_t header = dgc::kMessageHeaderBytes;
  if (message.size() < header) return;
  const bool tagged = (message[6] & dgc::kFlagTagged) != 0;
  if (tagged && message.size() < header + dgc::kTagBytes) return;
  const size_t payload = message.size() - header - (tagged ? dgc::kTagBytes : 0);
  dgc::store_le<uint32_t>(message.data() + 20, static_cast<uint32_t>(payload));
  dgc::store_le<uint32_t>(message.data() + 24, crc(message.data() + header, payload));
  dgc::store_le<uint32_t>(message.data() + 44, crc(message.data(), 44));
  if (tagged) {
    uint8_t route[8];
    dgc::store_le<uint32_t>(route, kRoute.sender);
    dgc::store_le<uint32_t>(route + 4, kRoute.receiver);
    const dgc::Tag tag =
        fuzz_key().tag({route, std::span<const uint8_t>(message.data(), header + payload)});
    std::memcpy(message.data() + header + payload, tag.data(), tag.size());
  }
}

const std::vector<uint64_t>& layout(int which) {
  static const std::vector<std::vector<uint64_t>> layouts = {
      {1, 5, 300, 4096}, {1}, {}, {2, 2, 70000}};
  return layouts[static_cast<size_t>(which)];
}

struct Entry {
  uint32_t tensor = 0;
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t options = data[0];
  std::vector<uint8_t> message(data + 1, data + size);
  if (options & 1) fix_header(message);
  const std::vector<uint64_t>& numels = layout((options >> 1) & 3);

  dgc::MessageExpectation expect;
  expect.authenticator = &fuzz_key();
  expect.route = kRoute;
  if (message.size() >= 16) {
    expect.iteration = dgc::load_le<uint64_t>(message.data() + 8);
  }
  const bool expecting = (options & 8) != 0;

  std::optional<ValidatedMessage> validated;
  if (!dgc::fuzz::accepted<DecodeError>([&] {
        validated.emplace(
            ValidatedMessage::validate(message, numels, expecting ? &expect : nullptr));
      })) {
    return 0;
  }
  const dgc::MessageInfo info = validated->info();

  // The elements as the visitor reports them, cut into entries where a tensor entry must end
  // (another tensor, or an index that does not increase).
  std::vector<Entry> entries;
  uint64_t elements = 0;
  dgc::for_each_element(*validated, [&](uint32_t tensor, uint64_t index, float value) {
    FUZZ_CHECK(tensor < numels.size(), "tensor %u of %zu", tensor, numels.size());
    FUZZ_CHECK(index < numels[tensor], "index %llu of %llu", (unsigned long long)index,
               (unsigned long long)numels[tensor]);
    FUZZ_CHECK(std::isfinite(value), "value %g", value);
    if (entries.empty() || entries.back().tensor != tensor ||
        entries.back().indices.back() >= index) {
      entries.push_back(Entry{tensor, {}, {}});
    }
    entries.back().indices.push_back(static_cast<uint32_t>(index));
    entries.back().values.push_back(value);
    ++elements;
  });
  FUZZ_CHECK(elements == info.element_count, "visited %llu, info says %llu",
             (unsigned long long)elements, (unsigned long long)info.element_count);

  // decode_add against the visitor, bitwise.
  std::vector<std::vector<float>> added(numels.size()), expected(numels.size());
  std::vector<std::span<float>> outputs;
  for (size_t t = 0; t < numels.size(); ++t) {
    added[t].assign(static_cast<size_t>(numels[t]), 0.5f);
    expected[t] = added[t];
    outputs.emplace_back(added[t]);
  }
  const float scale = 0.25f;
  std::vector<std::vector<uint64_t>> written(numels.size());
  dgc::decode_add(*validated, outputs, scale, written);
  dgc::for_each_element(*validated, [&](uint32_t tensor, uint64_t index, float value) {
    expected[tensor][index] += scale * value;
  });
  uint64_t written_count = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    FUZZ_CHECK(std::memcmp(added[t].data(), expected[t].data(), added[t].size() * 4) == 0,
               "decode_add differs from the visitor in tensor %zu", t);
    written_count += written[t].size();
  }
  FUZZ_CHECK(written_count == info.element_count, "written %llu of %llu",
             (unsigned long long)written_count, (unsigned long long)info.element_count);

  // Canonical encoding: only entries with at least one element can be rebuilt from the visitor;
  // a message with empty entries is compared on its element count alone.
  if (info.tensor_count == entries.size()) {
    dgc::MessageWriter writer(info.value_type, info.iteration, info.run_id);
    for (const Entry& e : entries) writer.add(e.tensor, numels[e.tensor], e.indices, e.values);
    writer.set_flags(info.flags & ~dgc::kFlagTagged);
    std::vector<uint8_t> again;
    if (info.flags & dgc::kFlagTagged) {
      // Only a message whose tag was checked (or made here) can be rebuilt byte for byte.
      if (!expecting && !(options & 1)) return 0;
      writer.finish(again, fuzz_key(), kRoute);
    } else {
      writer.finish(again);
    }
    FUZZ_CHECK(again == message, "re-encoding the decoded message gives other bytes (%zu vs %zu)",
               again.size(), message.size());
  }
  return 0;
}
