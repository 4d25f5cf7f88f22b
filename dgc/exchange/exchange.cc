#include "dgc/exchange/exchange.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"
#include "dgc/exchange/sparse_allreduce.h"

namespace dgc {

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

void Exchange::validate_all(uint64_t iteration, const char* what, uint32_t receiver, int& flagged) {
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
    for (int i = 0; i < 8; ++i)
      out[4 + kRunIdBytes + i] = static_cast<uint8_t>(iteration >> (8 * i));
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
                         " ", to_string(type), " values", authenticator_ ? " and a tag" : "", ")"));
    }
    if (authenticator_ &&
        !authenticator_->verify(
            {context(static_cast<int>(r)), std::span<const uint8_t>(all[r]).first(values_bytes)},
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
