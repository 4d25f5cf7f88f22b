#include "dgc/exchange/exchange.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"
#include "dgc/core/key_value.h"
#include "dgc/exchange/sparse_allreduce.h"

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
  // Settings before the layout: a differing setting (the policy, the dense path) explains a
  // differing layout.
  std::vector<std::map<std::string, std::string>> settings(n);
  std::map<std::string, bool> keys;
  for (size_t r = 0; r < n; ++r) {
    settings[r] = parse_key_value_lines(all[r].settings);
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
  message_compressed += other.message_compressed;
  message_dense_path += other.message_dense_path;
  message_headers += other.message_headers;
  dense_gradient += other.dense_gradient;
  wire_sent += other.wire_sent;
  wire_received += other.wire_received;
  dense_wire_sent += other.dense_wire_sent;
  return *this;
}

ExchangeBytes& ExchangeBytes::operator-=(const ExchangeBytes& other) {
  message -= other.message;
  message_compressed -= other.message_compressed;
  message_dense_path -= other.message_dense_path;
  message_headers -= other.message_headers;
  dense_gradient -= other.dense_gradient;
  wire_sent -= other.wire_sent;
  wire_received -= other.wire_received;
  dense_wire_sent -= other.dense_wire_sent;
  return *this;
}

RunId handshake(comm::Communicator& comm, std::span<const TensorSpec> layout,
                const std::string& settings, comm::Timeout timeout,
                const MessageAuthenticator* auth) {
  // What travels: u8 authenticated | run id (rank 0's counts) | description | tag (32 bytes,
  // authenticated only) over "DGCH-auth" | sender rank u32 | everything before the tag.
  static constexpr std::string_view kTagContext = "DGCH-auth";
  const auto tag_input = [](int rank) {
    std::array<uint8_t, kTagContext.size() + 4> out{};
    std::memcpy(out.data(), kTagContext.data(), kTagContext.size());
    for (int i = 0; i < 4; ++i) {
      out[kTagContext.size() + i] = static_cast<uint8_t>(static_cast<uint32_t>(rank) >> (8 * i));
    }
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
    return MismatchError(detail::concat(
        "handshake: rank ", r, " sent a description this rank cannot read (", gathered[r].size(),
        " bytes); are all ranks running the same dgc version?"));
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
    throw MismatchError(detail::concat(
        "handshake: ", ranks_have(with_key), " a job secret, ", ranks_have(without_key),
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
        "handshake: the description of rank", forged.size() > 1 ? "s " : " ",
        rank_list(forged), " does not carry a valid tag under rank ", comm.rank(),
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
  DGC_CHECK_GE(options_.rebalance_interval, 1, "rebalance interval");
  uint64_t compressed_total = 0;
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
      offsets_.push_back(compressed_total);
      compressed_total += numel;
    } else {
      dense_.push_back(i);
      dense_numel_ += numel;
    }
  }
  offsets_.push_back(compressed_total);
  if (options_.dense_path_group) {
    const size_t g = *options_.dense_path_group;
    const auto at = std::find(compressed_.begin(), compressed_.end(), g);
    DGC_CHECK(at != compressed_.end(),
              "the dense-path group must be a compressed tensor of the "
              "layout; found index ",
              g, " of ", layout_.size());
    group_ = static_cast<size_t>(at - compressed_.begin());
  }
  written_.resize(compressed_.size());
  algorithm_ = options_.algorithm == ExchangeAlgorithm::kAuto
                   ? choose_algorithm(comm_.size(), options_.density, compressed_total)
                   : options_.algorithm;
  bounds_ = sparse::equal_bounds(compressed_total, comm_.size());
  // The value type and the algorithm are part of what every rank must agree on.
  std::string settings = options_.settings;
  if (!settings.empty() && settings.back() != '\n') settings += '\n';
  settings += std::string("exchange.value_type=") + to_string(options_.value_type) + "\n";
  settings +=
      std::string("exchange.dense_value_type=") + to_string(options_.dense_value_type) + "\n";
  settings += detail::concat("exchange.algorithm=", to_string(options_.algorithm), " (",
                             to_string(algorithm_), ")\n");
  if (algorithm_ == ExchangeAlgorithm::kSparseAllreduce) {
    settings += detail::concat("exchange.rebalance_interval=", options_.rebalance_interval, "\n");
  }
  if (options_.algorithm == ExchangeAlgorithm::kAuto) {
    settings += detail::concat("exchange.density=", options_.density, "\n");
  }
  if (options_.message_key) authenticator_.emplace(*options_.message_key);
  run_id_ = handshake(comm_, layout_, settings, options_.timeout,
                      authenticator_ ? &*authenticator_ : nullptr);
}

void Exchange::forget_updates() { written_known_ = false; }

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point& start) {
  const auto now = Clock::now();
  const double s = std::chrono::duration<double>(now - start).count();
  start = now;
  return s;
}

}  // namespace

void Exchange::validate_all(uint64_t iteration, const char* what, uint32_t receiver,
                            int& flagged) {
  const int n = comm_.size();
  validated_.clear();
  validated_.reserve(static_cast<size_t>(n));
  flagged = 0;
  MessageExpectation expect;
  expect.run_id = run_id_;
  expect.iteration = iteration;
  expect.authenticator = authenticator_ ? &*authenticator_ : nullptr;
  expect.route.receiver = receiver;
  for (int r = 0; r < n; ++r) {
    expect.route.sender = static_cast<uint32_t>(r);
    try {
      validated_.push_back(ValidatedMessage::validate(received_[r], compressed_numels_, &expect));
    } catch (const DecodeError& e) {
      throw DecodeError(e.reason(), detail::concat(what, " from rank ", r, " of ", n,
                                                   " (iteration ", iteration, "): ", e.what()));
    }
    if (validated_.back().info().flags & kFlagBadGradient) ++flagged;
  }
}

void Exchange::finish(MessageWriter& writer, std::vector<uint8_t>& out, uint32_t receiver) {
  if (authenticator_) {
    writer.finish(out, *authenticator_, {static_cast<uint32_t>(comm_.rank()), receiver});
    last_.message_headers += kTagBytes;
  } else {
    writer.finish(out);
  }
}

void Exchange::add_entry(MessageWriter& writer, size_t i, std::span<const uint32_t> indices,
                         std::span<const float> values) {
  const size_t before = writer.payload_bytes();
  writer.add(static_cast<uint32_t>(i), compressed_numels_[i], indices, values);
  (group_ == i ? last_.message_dense_path : last_.message_compressed) +=
      writer.payload_bytes() - before;
}

void Exchange::sum_dense(uint64_t iteration, std::span<float> dense_flat) {
  if (options_.dense_value_type == ValueType::kFloat32 && !authenticator_) {
    comm_.allreduce_sum(dense_flat, options_.timeout);
    return;
  }
  // One buffer per rank, little endian (fp32, or 16-bit values), with a job key followed by its
  // tag over the run id, the iteration and the sender.
  const auto type = options_.dense_value_type;
  const size_t width = type == ValueType::kFloat32 ? 4 : 2;
  const size_t values_bytes = width * dense_flat.size();
  std::vector<uint8_t> mine(values_bytes);
  for (size_t e = 0; e < dense_flat.size(); ++e) {
    const uint32_t bits = type == ValueType::kFloat32   ? std::bit_cast<uint32_t>(dense_flat[e])
                          : type == ValueType::kFloat16 ? fp16_from_float(dense_flat[e])
                                                        : bf16_from_float(dense_flat[e]);
    for (size_t b = 0; b < width; ++b) mine[width * e + b] = static_cast<uint8_t>(bits >> (8 * b));
  }
  const auto context = [&](int sender) {
    std::array<uint8_t, 4 + kRunIdBytes + 8 + 4> out{'D', 'G', 'C', 'D'};
    std::memcpy(out.data() + 4, run_id_.data(), kRunIdBytes);
    for (int i = 0; i < 8; ++i) out[4 + kRunIdBytes + i] = static_cast<uint8_t>(iteration >> (8 * i));
    for (int i = 0; i < 4; ++i) {
      out[4 + kRunIdBytes + 8 + i] = static_cast<uint8_t>(static_cast<uint32_t>(sender) >> (8 * i));
    }
    return out;
  };
  if (authenticator_) {
    const Tag tag = authenticator_->tag({context(comm_.rank()), mine});
    mine.insert(mine.end(), tag.begin(), tag.end());
    last_.message_headers += kTagBytes;
    last_.message += kTagBytes;
  }
  const auto all = comm_.allgatherv(mine, options_.timeout);
  const auto value = [type, width](const std::vector<uint8_t>& bytes, size_t e) {
    uint32_t bits = 0;
    for (size_t b = 0; b < width; ++b) bits |= uint32_t{bytes[width * e + b]} << (8 * b);
    return type == ValueType::kFloat32   ? std::bit_cast<float>(bits)
           : type == ValueType::kFloat16 ? fp16_to_float(static_cast<uint16_t>(bits))
                                         : bf16_to_float(static_cast<uint16_t>(bits));
  };
  // Every rank's buffer is checked before anything is written.
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != mine.size()) {
      throw DecodeError(
          DecodeError::Reason::kMalformed,
          detail::concat("dense path from rank ", r, " (iteration ", iteration, ") has ",
                         all[r].size(), " bytes, expected ", mine.size(), " (", dense_flat.size(),
                         " ", to_string(type), " values", authenticator_ ? " and a tag" : "",
                         ")"));
    }
    if (authenticator_ &&
        !authenticator_->verify({context(static_cast<int>(r)),
                                 std::span<const uint8_t>(all[r]).first(values_bytes)},
                                std::span<const uint8_t>(all[r]).subspan(values_bytes))) {
      throw DecodeError(DecodeError::Reason::kBadTag,
                        detail::concat("dense path from rank ", r, " (iteration ", iteration,
                                       "): authentication tag does not verify (altered, replayed "
                                       "from another step or rank, or made without this job's "
                                       "secret); refused"));
    }
    for (size_t e = 0; e < dense_flat.size(); ++e) {
      if (!std::isfinite(value(all[r], e))) {
        throw DecodeError(DecodeError::Reason::kMalformed,
                          detail::concat("dense path from rank ", r, " (iteration ", iteration,
                                         "): value ", e, " is not finite"));
      }
    }
  }
  for (size_t e = 0; e < dense_flat.size(); ++e) {
    float sum = 0.0f;
    for (const auto& bytes : all) sum += value(bytes, e);
    dense_flat[e] = sum;
  }
}

// allgather / direct: this rank's one message to every rank.
void Exchange::exchange_messages(uint64_t iteration, std::span<const Selection> selections,
                                 uint16_t flags, int& flagged) {
  auto clock = Clock::now();
  MessageWriter writer(options_.value_type, iteration, run_id_);
  writer.set_flags(flags);
  for (size_t i = 0; i < compressed_.size(); ++i) {
    add_entry(writer, i, selections[i].indices, selections[i].values);
  }
  last_.message_headers = kMessageHeaderBytes;
  finish(writer, message_, kEveryRank);
  last_.message = message_.size();
  timings_.encode += seconds_since(clock);

  if (algorithm_ == ExchangeAlgorithm::kDirect) {
    const std::vector<std::span<const uint8_t>> to_each(static_cast<size_t>(comm_.size()),
                                                        message_);
    received_ = comm_.alltoallv(to_each, options_.timeout);
  } else {
    received_ = comm_.allgatherv(message_, options_.timeout);
  }
  timings_.collective += seconds_since(clock);
  validate_all(iteration, "message", kEveryRank, flagged);
  timings_.validate += seconds_since(clock);
}

// sparse-allreduce (sparse_allreduce.h): on return received_/validated_ hold the owners' kept
// sums, one message per owner.
void Exchange::sparse_allreduce(uint64_t iteration, std::span<const Selection> selections,
                                uint16_t flags, int& flagged) {
  const int n = comm_.size();
  const int me = comm_.rank();
  auto clock = Clock::now();

  // 1. Split this rank's selection by region: one message per owner.
  owner_messages_.resize(static_cast<size_t>(n));
  MessageWriter writer(options_.value_type, iteration, run_id_);
  last_.message = 0;
  for (int p = 0; p < n; ++p) {
    writer.reset(options_.value_type, iteration);
    writer.set_flags(flags);
    const uint64_t lo = bounds_[p], hi = bounds_[p + 1];
    for (size_t i = 0; i < compressed_.size(); ++i) {
      const uint64_t begin = std::max(lo, offsets_[i]), end = std::min(hi, offsets_[i + 1]);
      if (begin >= end) continue;
      const auto& indices = selections[i].indices;
      const auto first = std::lower_bound(indices.begin(), indices.end(),
                                          static_cast<uint64_t>(begin - offsets_[i]),
                                          [](uint32_t a, uint64_t b) { return a < b; });
      const auto last =
          std::lower_bound(first, indices.end(), static_cast<uint64_t>(end - offsets_[i]),
                           [](uint32_t a, uint64_t b) { return a < b; });
      const auto from = static_cast<size_t>(first - indices.begin());
      const auto count = static_cast<size_t>(last - first);
      add_entry(writer, i, std::span<const uint32_t>(indices).subspan(from, count),
                std::span<const float>(selections[i].values).subspan(from, count));
    }
    last_.message_headers += kMessageHeaderBytes;
    finish(writer, owner_messages_[p], static_cast<uint32_t>(p));
    last_.message += owner_messages_[p].size();
  }
  timings_.encode += seconds_since(clock);

  // 2. Every rank's part of region `me` to this rank.
  const std::vector<std::span<const uint8_t>> to_owner(owner_messages_.begin(),
                                                       owner_messages_.end());
  received_ = comm_.alltoallv(to_owner, options_.timeout);
  timings_.collective += seconds_since(clock);
  validate_all(iteration, "region message", static_cast<uint32_t>(me), flagged);
  timings_.validate += seconds_since(clock);
  if (flagged > 0) return;  // every rank saw every rank's flag: all stop here together

  // 3. Reduce region `me` and keep the largest sums.
  std::vector<std::vector<sparse::Entry>> streams(static_cast<size_t>(n));
  std::vector<uint64_t> indices;
  for (int r = 0; r < n; ++r) {
    const uint64_t lo = bounds_[me], hi = bounds_[me + 1];
    for_each_element(validated_[r], [&](uint32_t tensor, uint64_t index, float value) {
      const uint64_t global = offsets_[tensor] + index;
      if (global < lo || global >= hi) {
        throw DecodeError(DecodeError::Reason::kOutOfRange,
                          detail::concat("region message from rank ", r, " (iteration ", iteration,
                                         "): index ", global,
                                         " outside this rank's "
                                         "region [",
                                         lo, ", ", hi,
                                         "); the ranks disagree on "
                                         "the region bounds"));
      }
      streams[r].push_back({global, value});
    });
  }
  std::vector<sparse::Entry> reduced;
  const uint64_t contributions = sparse::reduce_sorted(streams, reduced);
  sparse::keep_largest(reduced, sparse::quota(contributions, n));
  timings_.decode += seconds_since(clock);

  // 4. The kept sums to every rank.
  writer.reset(options_.value_type, iteration);
  size_t at = 0;
  for (size_t i = 0; i < compressed_.size() && at < reduced.size(); ++i) {
    std::vector<uint32_t> local;
    std::vector<float> values;
    for (; at < reduced.size() && reduced[at].index < offsets_[i + 1]; ++at) {
      local.push_back(static_cast<uint32_t>(reduced[at].index - offsets_[i]));
      values.push_back(reduced[at].value);
    }
    if (!local.empty()) writer.add(static_cast<uint32_t>(i), compressed_numels_[i], local, values);
  }
  if (authenticator_) {
    writer.finish(message_, *authenticator_, {static_cast<uint32_t>(me), kEveryRank});
  } else {
    writer.finish(message_);
  }
  timings_.encode += seconds_since(clock);
  // Every rank sends its kept sums straight to every rank (alltoallv with the same message):
  // one round for the sizes and one for the payload, where a ring allgather would take N-1.
  const std::vector<std::span<const uint8_t>> to_each(static_cast<size_t>(n), message_);
  received_ = comm_.alltoallv(to_each, options_.timeout);
  timings_.collective += seconds_since(clock);
  int unused_flags = 0;
  validate_all(iteration, "reduced region message", kEveryRank, unused_flags);
  // Owner p may only send sums of region p: otherwise positions would be applied twice and the
  // hand-back below would be wrong. Checked before anything is written.
  for (int p = 0; p < n; ++p) {
    const uint64_t lo = bounds_[p], hi = bounds_[p + 1];
    for_each_element(validated_[p], [&](uint32_t tensor, uint64_t index, float) {
      const uint64_t global = offsets_[tensor] + index;
      if (global < lo || global >= hi) {
        throw DecodeError(
            DecodeError::Reason::kOutOfRange,
            detail::concat("reduced region message from rank ", p, " (iteration ", iteration,
                           "): index ", global, " outside its region [", lo, ", ", hi,
                           "); the ranks disagree on the region "
                           "bounds"));
      }
    });
  }
  timings_.validate += seconds_since(clock);
}

int Exchange::run(uint64_t iteration, std::span<const Selection> selections,
                  std::span<const std::span<float>> updates, std::span<float> dense_flat,
                  bool local_ok, std::span<Selection> unapplied) {
  DGC_CHECK_EQ(selections.size(), compressed_.size(), "one selection per compressed tensor");
  DGC_CHECK_EQ(updates.size(), compressed_.size(), "one update buffer per compressed tensor");
  DGC_CHECK_EQ(dense_flat.size(), dense_numel_, "dense_flat holds every dense-path element");
  DGC_CHECK(unapplied.empty() || unapplied.size() == compressed_.size(),
            "`unapplied` must be empty or hold one selection per compressed tensor, found ",
            unapplied.size(), " for ", compressed_.size());
  DGC_CHECK(
      algorithm_ != ExchangeAlgorithm::kSparseAllreduce || unapplied.size() == compressed_.size(),
      "the sparse-allreduce exchange hands back what it did not apply: pass `unapplied` "
      "and add it to the residual");
  for (size_t i = 0; i < compressed_.size(); ++i) {
    DGC_CHECK_EQ(updates[i].size(), compressed_numels_[i], "update buffer of tensor '",
                 layout_[compressed_[i]].name, "'");
  }
  const int n = comm_.size();
  const auto before = comm_.bytes();
  timings_ = ExchangeTimings{};
  last_ = ExchangeBytes{};
  const uint16_t flags = local_ok ? 0 : kFlagBadGradient;

  // 1-3. Encode, exchange, validate; every rank learns how many ranks flagged.
  int flagged = 0;
  if (algorithm_ == ExchangeAlgorithm::kSparseAllreduce) {
    sparse_allreduce(iteration, selections, flags, flagged);
  } else {
    exchange_messages(iteration, selections, flags, flagged);
  }
  auto clock = Clock::now();
  if (flagged == 0 && !dense_flat.empty()) {
    sum_dense(iteration, dense_flat);
    timings_.collective += seconds_since(clock);
  }

  const auto after = comm_.bytes();
  const uint64_t dense_bytes =
      (options_.dense_value_type == ValueType::kFloat32 ? 4 : 2) * dense_numel_;
  last_.message += dense_bytes;
  last_.message_dense_path += dense_bytes;
  last_.dense_gradient = 4 * total_numel_;
  last_.wire_sent = after.sent - before.sent;
  last_.wire_received = after.received - before.received;
  last_.dense_wire_sent = comm::ring_allreduce_bytes(4 * total_numel_, n).sent;
  total_ += last_;
  for (auto& u : unapplied) u.clear();
  if (flagged > 0) {
    applied_ = 0;
    return flagged;
  }

  // 4. Reset the update buffers: only the positions the previous call wrote when the buffers
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

  // 5. Sum the messages into the updates, recording the positions written.
  const float scale = 1.0f / static_cast<float>(n);
  for (const auto& m : validated_) decode_add(m, updates, scale, written_);
  written_buffers_.assign(updates.begin(), updates.end());
  written_known_ = true;
  for (float& x : dense_flat) x /= static_cast<float>(n);

  applied_ = 0;
  if (algorithm_ == ExchangeAlgorithm::kSparseAllreduce) {
    // The owners' regions are disjoint and in rank order, so written_[i] is sorted and holds
    // each applied position once.
    std::vector<uint64_t> applied_global;
    for (size_t i = 0; i < compressed_.size(); ++i) {
      const auto& written = written_[i];
      applied_ += written.size();
      // 6. Hand back what this rank selected at positions nobody applied.
      const auto& sel = selections[i];
      size_t w = 0;
      for (size_t j = 0; j < sel.indices.size(); ++j) {
        while (w < written.size() && written[w] < sel.indices[j]) ++w;
        if (w == written.size() || written[w] != sel.indices[j]) {
          unapplied[i].indices.push_back(sel.indices[j]);
          unapplied[i].values.push_back(sel.values[j]);
        }
      }
    }
    // 7. Re-balance the regions by where the applied positions fell (the same on every rank).
    if (++sparse_runs_ % static_cast<uint64_t>(options_.rebalance_interval) == 1 ||
        options_.rebalance_interval == 1) {
      applied_global.reserve(applied_);
      for (size_t i = 0; i < compressed_.size(); ++i) {
        for (uint64_t index : written_[i]) applied_global.push_back(offsets_[i] + index);
      }
      bounds_ = sparse::balanced_bounds(applied_global, offsets_.back(), n);
    }
  } else {
    for (const auto& written : written_) applied_ += written.size();
  }
  timings_.decode += seconds_since(clock);
  return 0;
}

}  // namespace dgc
