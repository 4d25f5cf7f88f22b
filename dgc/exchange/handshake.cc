#include "dgc/exchange/handshake.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include "dgc/core/bytes.h"
#include "dgc/core/error.h"
#include "dgc/core/key_value.h"

namespace dgc {
namespace {

const char* path_name(TensorPath path) {
  return path == TensorPath::kCompressed ? "compressed" : "dense";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

// ---- Handshake description: what one rank believes, serialised for the allgather. ----
//
// Binary, little endian: "DGCH" | u32 version | u32 world_size | u32 tensor_count |
// per tensor: str name | u32 ndim | i64 dims... | u8 path | then str settings.
// str = u32 length | bytes.

constexpr uint32_t kHandshakeVersion = 1;
constexpr size_t kMaxHandshakeString = size_t{1} << 24;

struct Description {
  uint32_t world_size = 0;
  std::vector<TensorSpec> layout;
  std::string settings;
};

std::vector<uint8_t> serialise(uint32_t world_size, std::span<const TensorSpec> layout,
                               const std::string& settings) {
  std::vector<uint8_t> out;
  ByteWriter writer(out);
  writer.raw("DGCH").u32(kHandshakeVersion).u32(world_size);
  writer.u32(static_cast<uint32_t>(layout.size()));
  for (const auto& t : layout) {
    writer.string(t.name).u32(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) writer.i64(d);
    writer.u8(static_cast<uint8_t>(t.path));
  }
  writer.string(settings);
  return out;
}

// A description another rank sent, or nothing when it is not one (any malformed field).
std::optional<Description> parse(std::span<const uint8_t> data) try {
  ByteReader p(data, "handshake description");
  const auto magic = p.raw(4, "magic");
  if (std::memcmp(magic.data(), "DGCH", 4) != 0) return std::nullopt;
  if (p.u32("version") != kHandshakeVersion) return std::nullopt;
  Description d;
  d.world_size = p.u32("world size");
  const uint32_t count = p.u32("tensor count");
  if (count > data.size()) return std::nullopt;  // each tensor takes > 1 byte
  d.layout.resize(count);
  for (auto& t : d.layout) {
    t.name = p.string(kMaxHandshakeString, "tensor name");
    const uint32_t ndim = p.u32("dimensions");
    if (ndim > 64) return std::nullopt;
    t.shape.resize(ndim);
    for (auto& dim : t.shape) dim = p.i64("dimension");
    const uint8_t path = p.u8("path");
    if (path > 1) return std::nullopt;
    t.path = static_cast<TensorPath>(path);
  }
  d.settings = p.string(kMaxHandshakeString, "settings");
  if (p.remaining() != 0) return std::nullopt;
  return d;
} catch (const DecodeError&) {
  return std::nullopt;
}

// One thing all ranks must agree on, with each rank's value.
struct Item {
  std::string what;
  std::vector<std::string> values;  // per rank
};

std::vector<Item> items_of(const std::vector<Description>& all) {
  const size_t n = all.size();
  std::vector<Item> items;
  auto add = [&](std::string what, auto value_of) {
    Item item{std::move(what), std::vector<std::string>(n)};
    for (size_t r = 0; r < n; ++r) item.values[r] = value_of(all[r]);
    items.push_back(std::move(item));
  };
  add("the world size", [](const Description& d) { return std::to_string(d.world_size); });
  // Settings before the layout: a differing setting (the policy, the dense path) explains a
  // differing layout.
  std::vector<std::map<std::string, std::string>> settings(n);
  std::map<std::string, bool> keys;
  for (size_t r = 0; r < n; ++r) {
    settings[r] = parse_key_value_lines(all[r].settings);
    for (const auto& kv : settings[r]) keys[kv.first] = true;
  }
  auto add_setting = [&](const std::string& key) {
    Item item{detail::concat("setting '", key, "'"), std::vector<std::string>(n)};
    for (size_t r = 0; r < n; ++r) {
      auto it = settings[r].find(key);
      item.values[r] = it == settings[r].end() ? "(not set)" : "'" + it->second + "'";
    }
    items.push_back(std::move(item));
  };
  // The gradient buckets' keys (dgc/train/buckets.cc) last: a step that must travel in one
  // message has none, so a differing setting that decides it (on_nonfinite, clipping) is the one
  // to name.
  static const std::vector<std::string> kBucketKeys = {"bucket_cap_mb", "last_bucket_cap_mb",
                                                       "buckets", "bucket"};
  for (const auto& [key, unused] : keys) {
    if (std::find(kBucketKeys.begin(), kBucketKeys.end(), key) == kBucketKeys.end()) {
      add_setting(key);
    }
  }
  for (const auto& key : kBucketKeys) {
    if (keys.count(key) != 0) add_setting(key);
  }
  add("the number of tensors",
      [](const Description& d) { return std::to_string(d.layout.size()); });
  size_t max_tensors = 0;
  for (const auto& d : all) max_tensors = std::max(max_tensors, d.layout.size());
  for (size_t i = 0; i < max_tensors; ++i) {
    const std::string name = i < all[0].layout.size() ? " ('" + all[0].layout[i].name + "')" : "";
    add(detail::concat("tensor ", i, name), [i](const Description& d) -> std::string {
      if (i >= d.layout.size()) return "(no such tensor)";
      const auto& t = d.layout[i];
      return detail::concat("'", t.name, "' shape ", shape_text(t.shape), " path ",
                            path_name(t.path));
    });
  }
  return items;
}

}  // namespace

RunId handshake(comm::Communicator& comm, std::span<const TensorSpec> layout,
                const std::string& settings, comm::Timeout timeout,
                const MessageAuthenticator* auth) {
  // What travels: u8 authenticated | run id (rank 0's counts) | description | tag (32 bytes,
  // authenticated only) over "DGCH-auth" | sender rank u32 | everything before the tag.
  static constexpr std::string_view kTagContext = "DGCH-auth";
  const auto tag_input = [](int rank) {
    std::array<uint8_t, kTagContext.size() + 4> out{};
    std::memcpy(out.data(), kTagContext.data(), kTagContext.size());
    store_le(out.data() + kTagContext.size(), static_cast<uint32_t>(rank));
    return out;
  };
  const RunId drawn = comm.rank() == 0 ? random_run_id() : RunId{};
  std::vector<uint8_t> mine = {static_cast<uint8_t>(auth != nullptr ? 1 : 0)};
  mine.insert(mine.end(), drawn.begin(), drawn.end());
  const auto description = serialise(static_cast<uint32_t>(comm.size()), layout, settings);
  mine.insert(mine.end(), description.begin(), description.end());
  if (auth != nullptr) {
    const Tag tag = auth->tag({tag_input(comm.rank()), mine});
    mine.insert(mine.end(), tag.begin(), tag.end());
  }
  const auto gathered = comm.allgatherv(mine, timeout);
  const int n = comm.size();
  constexpr size_t kPrefix = 1 + kRunIdBytes;
  const auto unreadable = [&](int r) {
    return MismatchError(
        detail::concat("handshake: rank ", r, " sent a description this rank cannot read (",
                       gathered[r].size(), " bytes); are all ranks running the same dgc version?"));
  };
  // Authentication first: a rank without the job's secret is named before anything it sent is
  // read.
  std::vector<int> with_key, without_key;
  for (int r = 0; r < n; ++r) {
    if (gathered[r].size() < kPrefix || gathered[r][0] > 1) throw unreadable(r);
    (gathered[r][0] == 1 ? with_key : without_key).push_back(r);
  }
  if (!with_key.empty() && !without_key.empty()) {
    const auto ranks_have = [](const std::vector<int>& ranks) {
      return detail::concat(ranks.size() > 1 ? "ranks " : "rank ", rank_list(ranks),
                            ranks.size() > 1 ? " have" : " has");
    };
    throw MismatchError(detail::concat("handshake: ", ranks_have(with_key), " a job secret, ",
                                       ranks_have(without_key),
                                       " none; give every rank the same secret (", kJobSecretEnv,
                                       " or --job-secret-file) or none"));
  }
  std::vector<std::span<const uint8_t>> bodies(n);
  std::vector<int> forged;
  for (int r = 0; r < n; ++r) {
    std::span<const uint8_t> body(gathered[r]);
    if (auth != nullptr) {
      if (body.size() < kPrefix + kTagBytes) throw unreadable(r);
      const auto signed_part = body.first(body.size() - kTagBytes);
      if (!auth->verify({tag_input(r), signed_part}, body.last(kTagBytes))) forged.push_back(r);
      body = signed_part;
    }
    bodies[r] = body.subspan(kPrefix);
  }
  if (!forged.empty()) {
    throw AuthenticationError(detail::concat(
        "handshake: the description of rank", forged.size() > 1 ? "s " : " ", rank_list(forged),
        " does not carry a valid tag under rank ", comm.rank(),
        "'s job secret: the ranks were given different secrets (", kJobSecretEnv,
        " or --job-secret-file), or a stranger is on the connection; give every rank the same "
        "secret"));
  }
  RunId run_id{};
  std::memcpy(run_id.data(), gathered[0].data() + 1, kRunIdBytes);
  std::vector<Description> all(n);
  for (int r = 0; r < n; ++r) {
    auto d = parse(bodies[r]);
    if (!d) throw unreadable(r);
    all[r] = std::move(*d);
  }
  for (const Item& item : items_of(all)) {
    std::map<std::string, std::vector<int>> differing;  // value -> ranks
    for (int r = 1; r < n; ++r) {
      if (item.values[r] != item.values[0]) differing[item.values[r]].push_back(r);
    }
    if (differing.empty()) continue;
    std::ostringstream out;
    out << "handshake: ranks disagree on " << item.what << ": rank 0 has " << item.values[0];
    for (const auto& [value, ranks] : differing) {
      out << "; rank" << (ranks.size() > 1 ? "s " : " ");
      for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
      out << (ranks.size() > 1 ? " have " : " has ") << value;
    }
    out << ". Every rank must build the same model (names, shapes, order) with the same "
           "compression settings.";
    throw MismatchError(out.str());
  }
  return run_id;
}

void broadcast_parameters(comm::Communicator& comm, std::span<const std::span<float>> parameters,
                          comm::Timeout timeout) {
  uint64_t total = 0;
  for (const auto& p : parameters) total += p.size();
  // Check the sizes first so that a mismatch is an error, not a hang or a garbled copy.
  uint8_t total_bytes[8];
  store_le(total_bytes, total);
  const auto totals = comm.allgatherv(total_bytes, timeout);
  for (int r = 0; r < comm.size(); ++r) {
    const uint64_t theirs = totals[r].size() == 8 ? load_le<uint64_t>(totals[r].data()) : 0;
    if (totals[r].size() != 8 || theirs != total) {
      throw MismatchError(detail::concat("broadcast_parameters: rank ", comm.rank(), " has ", total,
                                         " parameter elements but rank ", r, " has ", theirs,
                                         "; every rank must build the same model"));
    }
  }
  if (comm.size() == 1 || total == 0) return;
  std::vector<float> flat;
  flat.reserve(total);
  for (const auto& p : parameters) flat.insert(flat.end(), p.begin(), p.end());
  comm::broadcast_floats(comm, flat, 0, timeout);
  size_t offset = 0;
  for (const auto& p : parameters) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(offset), p.size(), p.begin());
    offset += p.size();
  }
}

}  // namespace dgc
