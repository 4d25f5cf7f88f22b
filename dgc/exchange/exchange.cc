#include "dgc/exchange/exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"

namespace dgc {
namespace {

const char* path_name(TensorPath path) {
  return path == TensorPath::kCompressed ? "compressed" : "dense";
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

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_i64(std::vector<uint8_t>& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

std::vector<uint8_t> serialise(uint32_t world_size, std::span<const TensorSpec> layout,
                               const std::string& settings) {
  std::vector<uint8_t> out = {'D', 'G', 'C', 'H'};
  put_u32(out, kHandshakeVersion);
  put_u32(out, world_size);
  put_u32(out, static_cast<uint32_t>(layout.size()));
  for (const auto& t : layout) {
    put_str(out, t.name);
    put_u32(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put_i64(out, d);
    out.push_back(static_cast<uint8_t>(t.path));
  }
  put_str(out, settings);
  return out;
}

class Parser {
 public:
  explicit Parser(std::span<const uint8_t> data) : data_(data) {}
  bool ok() const { return ok_; }
  bool need(size_t n) {
    if (!ok_ || data_.size() - pos_ < n) ok_ = false;
    return ok_;
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{data_[pos_ + i]} << (8 * i);
    pos_ += 4;
    return v;
  }
  int64_t i64() {
    if (!need(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{data_[pos_ + i]} << (8 * i);
    pos_ += 8;
    return static_cast<int64_t>(v);
  }
  uint8_t u8() { return need(1) ? data_[pos_++] : 0; }
  std::string str() {
    const uint32_t n = u32();
    if (n > kMaxHandshakeString || !need(n)) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  bool at_end() const { return ok_ && pos_ == data_.size(); }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

std::optional<Description> parse(std::span<const uint8_t> data) {
  Parser p(data);
  if (!p.need(4) || std::memcmp(data.data(), "DGCH", 4) != 0) return std::nullopt;
  p.u8(), p.u8(), p.u8(), p.u8();
  if (p.u32() != kHandshakeVersion) return std::nullopt;
  Description d;
  d.world_size = p.u32();
  const uint32_t count = p.u32();
  if (!p.ok() || count > data.size()) return std::nullopt;  // each tensor takes > 1 byte
  d.layout.resize(count);
  for (auto& t : d.layout) {
    t.name = p.str();
    const uint32_t ndim = p.u32();
    if (!p.ok() || ndim > 64) return std::nullopt;
    t.shape.resize(ndim);
    for (auto& dim : t.shape) dim = p.i64();
    const uint8_t path = p.u8();
    if (path > 1) return std::nullopt;
    t.path = static_cast<TensorPath>(path);
  }
  d.settings = p.str();
  if (!p.at_end()) return std::nullopt;
  return d;
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
  std::vector<std::map<std::string, std::string>> settings(n);
  std::map<std::string, bool> keys;
  for (size_t r = 0; r < n; ++r) {
    settings[r] = parse_settings(all[r].settings);
    for (const auto& kv : settings[r]) keys[kv.first] = true;
  }
  for (const auto& [key, unused] : keys) {
    Item item{detail::concat("setting '", key, "'"), std::vector<std::string>(n)};
    for (size_t r = 0; r < n; ++r) {
      auto it = settings[r].find(key);
      item.values[r] = it == settings[r].end() ? "(not set)" : "'" + it->second + "'";
    }
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> make_layout(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
    const PolicyOptions& policy) {
  std::vector<TensorSpec> layout;
  layout.reserve(named_shapes.size());
  for (const auto& [name, shape] : named_shapes) {
    layout.push_back(TensorSpec{name, shape, choose_path(shape, policy)});
  }
  return layout;
}

ExchangeBytes& ExchangeBytes::operator+=(const ExchangeBytes& other) {
  message += other.message;
  dense_gradient += other.dense_gradient;
  wire_sent += other.wire_sent;
  wire_received += other.wire_received;
  dense_wire_sent += other.dense_wire_sent;
  return *this;
}

void handshake(comm::Communicator& comm, std::span<const TensorSpec> layout,
               const std::string& settings, comm::Timeout timeout) {
  const auto mine = serialise(static_cast<uint32_t>(comm.size()), layout, settings);
  const auto gathered = comm.allgatherv(mine, timeout);
  const int n = comm.size();
  std::vector<Description> all(n);
  for (int r = 0; r < n; ++r) {
    auto d = parse(gathered[r]);
    if (!d) {
      throw MismatchError(detail::concat(
          "handshake: rank ", r, " sent a description this rank cannot read (", gathered[r].size(),
          " bytes); are all ranks running the same dgc version?"));
    }
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
}

void broadcast_parameters(comm::Communicator& comm, std::span<const std::span<float>> parameters,
                          comm::Timeout timeout) {
  uint64_t total = 0;
  for (const auto& p : parameters) total += p.size();
  // Check the sizes first so that a mismatch is an error, not a hang or a garbled copy.
  uint8_t total_bytes[8];
  for (int i = 0; i < 8; ++i) total_bytes[i] = static_cast<uint8_t>(total >> (8 * i));
  const auto totals = comm.allgatherv(total_bytes, timeout);
  for (int r = 0; r < comm.size(); ++r) {
    uint64_t theirs = 0;
    if (totals[r].size() == 8) {
      for (int i = 0; i < 8; ++i) theirs |= uint64_t{totals[r][i]} << (8 * i);
    }
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

Exchange::Exchange(comm::Communicator& comm, std::vector<TensorSpec> layout,
                   ExchangeOptions options)
    : comm_(comm), layout_(std::move(layout)), options_(std::move(options)) {
  for (size_t i = 0; i < layout_.size(); ++i) {
    const auto& t = layout_[i];
    for (int64_t d : t.shape) {
      DGC_CHECK_GE(d, 0, "tensor '", t.name, "' has a negative dimension");
    }
    const auto numel = static_cast<uint64_t>(t.numel());
    total_numel_ += numel;
    if (t.path == TensorPath::kCompressed) {
      DGC_CHECK_LE(numel, uint64_t{std::numeric_limits<uint32_t>::max()} + 1, "compressed tensor '",
                   t.name, "' is too large for 32-bit indices");
      compressed_.push_back(i);
      compressed_numels_.push_back(numel);
    } else {
      dense_.push_back(i);
      dense_numel_ += numel;
    }
  }
  dense_buffer_.resize(dense_numel_ + 1);
  flag_in_message_ = dense_.empty();
  written_.resize(compressed_.size());
  // The value type is part of what every rank must agree on.
  std::string settings = options_.settings;
  if (!settings.empty() && settings.back() != '\n') settings += '\n';
  settings += std::string("exchange.value_type=") + to_string(options_.value_type) + "\n";
  handshake(comm_, layout_, settings, options_.timeout);
}

void Exchange::forget_updates() { written_known_ = false; }

int Exchange::run(uint64_t iteration, std::span<const Selection> selections,
                  std::span<const std::span<float>> updates, std::span<float> dense_flat,
                  bool local_ok) {
  DGC_CHECK_EQ(selections.size(), compressed_.size(), "one selection per compressed tensor");
  DGC_CHECK_EQ(updates.size(), compressed_.size(), "one update buffer per compressed tensor");
  DGC_CHECK_EQ(dense_flat.size(), dense_numel_, "dense_flat holds every dense-path element");
  for (size_t i = 0; i < compressed_.size(); ++i) {
    DGC_CHECK_EQ(updates[i].size(), compressed_numels_[i], "update buffer of tensor '",
                 layout_[compressed_[i]].name, "'");
  }
  const int n = comm_.size();
  const auto before = comm_.bytes();

  // 1. This rank's message: every compressed tensor's selection (and, without dense-path
  // tensors, the bad-gradient flag as one byte after it).
  MessageWriter writer(options_.value_type, iteration);
  for (size_t i = 0; i < compressed_.size(); ++i) {
    writer.add(static_cast<uint32_t>(i), compressed_numels_[i], selections[i].indices,
               selections[i].values);
  }
  writer.finish(message_);
  if (flag_in_message_) message_.push_back(local_ok ? 0 : 1);

  // 2. Allgather the messages; 3. the bad-gradient flag: from the messages, or from the
  // allreduce of the dense path.
  const auto messages = comm_.allgatherv(message_, options_.timeout);
  std::vector<std::span<const uint8_t>> codec_messages(messages.begin(), messages.end());
  int flagged = 0;
  if (flag_in_message_) {
    for (int r = 0; r < n; ++r) {
      const uint8_t flag = codec_messages[r].empty() ? 0xFF : codec_messages[r].back();
      if (flag > 1) {
        throw DecodeError(
            DecodeError::Reason::kMalformed,
            detail::concat(
                "message from rank ", r, " of ", n, " (iteration ", iteration, "): ",
                codec_messages[r].empty()
                    ? std::string("empty, no bad-gradient flag")
                    : detail::concat("bad-gradient flag ", int{flag}, ", expected 0 or 1")));
      }
      flagged += flag;
      codec_messages[r] = codec_messages[r].first(codec_messages[r].size() - 1);
    }
  } else {
    std::copy(dense_flat.begin(), dense_flat.end(), dense_buffer_.begin());
    dense_buffer_.back() = local_ok ? 0.0f : 1.0f;
    comm_.allreduce_sum(dense_buffer_, options_.timeout);
    flagged = static_cast<int>(std::lround(dense_buffer_.back()));
  }

  const auto after = comm_.bytes();
  last_ = ExchangeBytes{};
  last_.message = message_.size() + 4 * dense_numel_;
  last_.dense_gradient = 4 * total_numel_;
  last_.wire_sent = after.sent - before.sent;
  last_.wire_received = after.received - before.received;
  last_.dense_wire_sent = comm::ring_allreduce_bytes(4 * total_numel_, n).sent;
  total_ += last_;

  if (flagged > 0) return flagged;

  // 4. Validate every message before writing anything.
  std::vector<ValidatedMessage> validated;
  validated.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    try {
      validated.push_back(ValidatedMessage::validate(codec_messages[r], compressed_numels_));
    } catch (const DecodeError& e) {
      throw DecodeError(e.reason(), detail::concat("message from rank ", r, " of ", n,
                                                   " (iteration ", iteration, "): ", e.what()));
    }
    const uint64_t message_iteration = validated.back().info().iteration;
    if (message_iteration != iteration) {
      throw DecodeError(DecodeError::Reason::kMalformed,
                        detail::concat("message from rank ", r, " is for iteration ",
                                       message_iteration, " but this rank is at iteration ",
                                       iteration, "; the ranks are out of step"));
    }
  }

  // 5. Reset the update buffers: only the positions the previous call wrote when the buffers
  // are the same, else in full.
  bool same_buffers = written_known_ && written_buffers_.size() == updates.size();
  for (size_t i = 0; same_buffers && i < updates.size(); ++i) {
    same_buffers = written_buffers_[i].data() == updates[i].data() &&
                   written_buffers_[i].size() == updates[i].size();
  }
  written_known_ = false;  // until the additions below are done
  for (size_t i = 0; i < updates.size(); ++i) {
    if (same_buffers) {
      float* out = updates[i].data();
      for (uint64_t index : written_[i]) out[index] = 0.0f;
    } else {
      std::fill(updates[i].begin(), updates[i].end(), 0.0f);
    }
    written_[i].clear();
  }

  // 6. Sum the messages into the updates, recording the positions written.
  const float scale = 1.0f / static_cast<float>(n);
  for (const auto& m : validated) decode_add(m, updates, scale, written_);
  written_buffers_.assign(updates.begin(), updates.end());
  written_known_ = true;
  for (size_t i = 0; i < dense_flat.size(); ++i)
    dense_flat[i] = dense_buffer_[i] / static_cast<float>(n);
  return 0;
}

std::map<std::string, std::string> parse_settings(const std::string& settings) {
  std::map<std::string, std::string> out;
  std::istringstream in(settings);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      out[line] = "";
    } else {
      out[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return out;
}

}  // namespace dgc
