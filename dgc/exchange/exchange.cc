#include "dgc/exchange/exchange.h"

#include <algorithm>
#include <string>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"
#include "dgc/exchange/allgather.h"
#include "dgc/exchange/dense_path.h"

namespace dgc {
namespace {

// What every rank must agree on: the caller's settings, and the exchange's value types and
// algorithm (the requested one and the one it resolved to).
std::string exchange_settings(const ExchangeOptions& options, ExchangeAlgorithm algorithm) {
  std::string settings = options.settings;
  if (!settings.empty() && settings.back() != '\n') settings += '\n';
  settings += std::string("exchange.value_type=") + to_string(options.value_type) + "\n";
  settings +=
      std::string("exchange.dense_value_type=") + to_string(options.dense_value_type) + "\n";
  settings += detail::concat("exchange.algorithm=", to_string(options.algorithm), " (",
                             to_string(algorithm), ")\n");
  if (algorithm == ExchangeAlgorithm::kSparseAllreduce) {
    settings += detail::concat("exchange.rebalance_interval=", options.rebalance_interval, "\n");
  }
  if (options.algorithm == ExchangeAlgorithm::kAuto) {
    settings += detail::concat("exchange.density=", options.density, "\n");
  }
  return settings;
}

ExchangeTimings timings_of(const PhaseClock& clock) {
  return {clock.seconds(Phase::kEncode), clock.seconds(Phase::kCollective),
          clock.seconds(Phase::kValidate), clock.seconds(Phase::kDecode)};
}

}  // namespace

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
  index_ = index_layout(layout_, options_.dense_path_group);
  written_.positions.resize(index_.compressed.size());
  const uint64_t compressed_total = index_.offsets.back();
  algorithm_ = options_.algorithm == ExchangeAlgorithm::kAuto
                   ? choose_algorithm(comm_.size(), options_.density, compressed_total)
                   : options_.algorithm;
  sparse_.bounds = sparse::equal_bounds(compressed_total, comm_.size());
  if (options_.message_key) job_.authenticator.emplace(*options_.message_key);
  job_.run_id = handshake(comm_, layout_, exchange_settings(options_, algorithm_), options_.timeout,
                          job_.auth());
}

void Exchange::forget_updates() { written_.known = false; }

std::span<const uint64_t> Exchange::last_written(size_t i) const {
  DGC_CHECK(records_written(), "last_written needs ExchangeOptions::record_written");
  DGC_CHECK_LT(i, written_.positions.size(), "no such compressed tensor");
  return written_.positions[i];
}

int Exchange::run(uint64_t iteration, std::span<const Selection> selections,
                  std::span<const std::span<float>> updates, std::span<float> dense_flat,
                  bool local_ok, std::span<Selection> unapplied) {
  const size_t compressed = index_.compressed.size();
  DGC_CHECK_EQ(selections.size(), compressed, "one selection per compressed tensor");
  DGC_CHECK_EQ(updates.size(), compressed, "one update buffer per compressed tensor");
  DGC_CHECK_EQ(dense_flat.size(), index_.dense_numel, "dense_flat holds every dense-path element");
  DGC_CHECK(unapplied.empty() || unapplied.size() == compressed,
            "`unapplied` must be empty or hold one selection per compressed tensor, found ",
            unapplied.size(), " for ", compressed);
  DGC_CHECK(algorithm_ != ExchangeAlgorithm::kSparseAllreduce || unapplied.size() == compressed,
            "the sparse-allreduce exchange hands back what it did not apply: pass `unapplied` "
            "and add it to the residual");
  for (size_t i = 0; i < compressed; ++i) {
    DGC_CHECK_EQ(updates[i].size(), index_.compressed_numels[i], "update buffer of tensor '",
                 layout_[index_.compressed[i]].name, "'");
  }
  const int n = comm_.size();
  const auto before = comm_.bytes();
  last_ = LastRun{};
  PhaseClock clock;
  const MessageContext context{comm_,
                               job_,
                               index_,
                               options_.value_type,
                               options_.timeout,
                               iteration,
                               static_cast<uint16_t>(local_ok ? 0 : kFlagBadGradient),
                               selections,
                               buffers_,
                               clock};

  // 1-3. Encode, exchange, validate by the algorithm; every rank learns how many ranks flagged.
  const AlgorithmResult result =
      algorithm_ == ExchangeAlgorithm::kSparseAllreduce
          ? sparse_allreduce({context, sparse_})
          : allgather({context, algorithm_ == ExchangeAlgorithm::kDirect});
  uint64_t dense_tag_bytes = 0;
  if (result.flagged == 0 && !dense_flat.empty()) {
    dense_tag_bytes = sum_dense_path(
        {comm_, job_, options_.dense_value_type, options_.timeout, iteration}, dense_flat);
    clock.lap(Phase::kCollective);
  }

  // The bytes of this iteration: this rank's messages, the dense path, the collectives.
  const auto after = comm_.bytes();
  const uint64_t dense_values =
      (options_.dense_value_type == ValueType::kFloat32 ? 4 : 2) * index_.dense_numel;
  ExchangeBytes& bytes = last_.bytes;
  bytes.message = result.sent.total + dense_values + dense_tag_bytes;
  bytes.message_compressed = result.sent.compressed;
  bytes.message_dense_path = result.sent.dense_path + dense_values;
  bytes.message_headers = result.sent.headers + dense_tag_bytes;
  bytes.dense_gradient = 4 * index_.total_numel;
  bytes.wire_sent = after.sent - before.sent;
  bytes.wire_received = after.received - before.received;
  bytes.dense_wire_sent = comm::ring_allreduce_bytes(4 * index_.total_numel, n).sent;
  total_ += bytes;
  for (auto& u : unapplied) u.clear();
  if (result.flagged > 0) {
    last_.timings = timings_of(clock);
    buffers_.release_received();
    return result.flagged;
  }

  // 4. Reset the update buffers: only the positions the previous call wrote when the buffers
  // are the same, else in full.
  bool same_buffers = written_.known && written_.buffers.size() == updates.size();
  for (size_t i = 0; same_buffers && i < updates.size(); ++i) {
    same_buffers = written_.buffers[i].data() == updates[i].data() &&
                   written_.buffers[i].size() == updates[i].size();
  }
  written_.known = false;  // until the additions below are done
  for (size_t i = 0; i < updates.size(); ++i) {
    if (same_buffers) {
      float* out = updates[i].data();
      for (uint64_t index : written_.positions[i]) out[index] = 0.0f;
    } else {
      std::fill(updates[i].begin(), updates[i].end(), 0.0f);
    }
    written_.positions[i].clear();
  }

  // 5. Sum the messages into the updates, recording the positions written (if asked).
  const float scale = 1.0f / static_cast<float>(n);
  const bool record = records_written();
  for (const auto& m : buffers_.validated) {
    decode_add(m, updates, scale,
               record ? std::span<std::vector<uint64_t>>(written_.positions)
                      : std::span<std::vector<uint64_t>>());
    last_.applied += m.info().element_count;
  }
  written_.buffers.assign(updates.begin(), updates.end());
  written_.known = record;
  for (float& x : dense_flat) x /= static_cast<float>(n);

  if (algorithm_ == ExchangeAlgorithm::kSparseAllreduce) {
    // The owners' regions are disjoint and in rank order, so written_.positions[i] is sorted and
    // holds each applied position once.
    // 6. Hand back what this rank selected at positions nobody applied.
    for (size_t i = 0; i < compressed; ++i) {
      sparse::hand_back(selections[i], written_.positions[i], unapplied[i]);
    }
    // 7. Re-balance the regions by where the applied positions fell (the same on every rank).
    rebalance_regions(sparse_, written_.positions, index_.offsets, options_.rebalance_interval, n);
  }
  clock.lap(Phase::kDecode);
  last_.timings = timings_of(clock);
  buffers_.release_received();  // nothing of this iteration is read again
  return 0;
}

}  // namespace dgc
