#include "dgc/exchange/sparse_allreduce.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "dgc/core/error.h"

namespace dgc {
namespace {

// Throws a DecodeError (kOutOfRange) unless every element of `message` (`what` from `sender`)
// lies in region `owner`, [bounds[owner], bounds[owner + 1]); `whose` names the region in the
// error. With `entries`, appends every element to it in the global index space.
void check_region(const ValidatedMessage& message, const LayoutIndex& layout,
                  std::span<const uint64_t> bounds, int owner, const char* whose, const char* what,
                  int sender, uint64_t iteration, std::vector<sparse::Entry>* entries) {
  const uint64_t lo = bounds[owner], hi = bounds[owner + 1];
  for_each_element(message, [&](uint32_t tensor, uint64_t index, float value) {
    const uint64_t global = layout.offsets[tensor] + index;
    if (global < lo || global >= hi) {
      throw DecodeError(DecodeError::Reason::kOutOfRange,
                        detail::concat(what, " from rank ", sender, " (iteration ", iteration,
                                       "): index ", global, " outside ", whose, " region [", lo,
                                       ", ", hi, "); the ranks disagree on the region bounds"));
    }
    if (entries != nullptr) entries->push_back({global, value});
  });
}

}  // namespace

AlgorithmResult sparse_allreduce(const SparseAllreduceOptions& options) {
  const MessageContext& context = options.context;
  const LayoutIndex& layout = context.layout;
  const auto& bounds = options.state.bounds;
  auto& owner_messages = options.state.owner_messages;
  auto& buffers = context.buffers;
  const int n = context.comm.size();
  const int me = context.comm.rank();

  // 1. Split this rank's selection by region: one message per owner.
  owner_messages.resize(static_cast<size_t>(n));
  MessageEncoder encoder(context);
  for (int p = 0; p < n; ++p) {
    encoder.begin(context.flags);
    const uint64_t lo = bounds[p], hi = bounds[p + 1];
    for (size_t i = 0; i < layout.compressed.size(); ++i) {
      const uint64_t begin = std::max(lo, layout.offsets[i]);
      const uint64_t end = std::min(hi, layout.offsets[i + 1]);
      if (begin >= end) continue;
      const auto& indices = context.selections[i].indices;
      const auto first = std::lower_bound(indices.begin(), indices.end(),
                                          static_cast<uint64_t>(begin - layout.offsets[i]),
                                          [](uint32_t a, uint64_t b) { return a < b; });
      const auto last =
          std::lower_bound(first, indices.end(), static_cast<uint64_t>(end - layout.offsets[i]),
                           [](uint32_t a, uint64_t b) { return a < b; });
      const auto from = static_cast<size_t>(first - indices.begin());
      const auto count = static_cast<size_t>(last - first);
      encoder.add(i, std::span<const uint32_t>(indices).subspan(from, count),
                  std::span<const float>(context.selections[i].values).subspan(from, count));
    }
    encoder.finish(owner_messages[p], static_cast<uint32_t>(p));
  }
  const MessageBytes sent = encoder.bytes();  // this rank's contribution (not the kept sums)
  context.clock.lap(Phase::kEncode);

  // 2. Every rank's part of region `me` to this rank.
  const std::vector<std::span<const uint8_t>> to_owner(owner_messages.begin(),
                                                       owner_messages.end());
  buffers.release_received();
  buffers.received = context.comm.alltoallv(to_owner, context.timeout);
  context.clock.lap(Phase::kCollective);
  const int flagged = validate_messages(context, "region message", static_cast<uint32_t>(me));
  context.clock.lap(Phase::kValidate);
  // Every rank saw every rank's flag: all stop here together.
  if (flagged > 0) return {flagged, sent};

  // 3. Reduce region `me` and keep the largest sums.
  std::vector<std::vector<sparse::Entry>> streams(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    check_region(buffers.validated[r], layout, bounds, me, "this rank's", "region message", r,
                 context.iteration, &streams[r]);
  }
  std::vector<sparse::Entry> reduced;
  const uint64_t contributions = sparse::reduce_sorted(streams, reduced);
  sparse::keep_largest(reduced, sparse::quota(contributions, n));
  context.clock.lap(Phase::kDecode);

  // 4. The kept sums to every rank.
  encoder.begin(0);
  size_t at = 0;
  for (size_t i = 0; i < layout.compressed.size() && at < reduced.size(); ++i) {
    std::vector<uint32_t> local;
    std::vector<float> values;
    for (; at < reduced.size() && reduced[at].index < layout.offsets[i + 1]; ++at) {
      local.push_back(static_cast<uint32_t>(reduced[at].index - layout.offsets[i]));
      values.push_back(reduced[at].value);
    }
    if (!local.empty()) encoder.add(i, local, values);
  }
  encoder.finish(buffers.message, kEveryRank);
  context.clock.lap(Phase::kEncode);
  // Every rank sends its kept sums straight to every rank (alltoallv with the same message):
  // one round for the sizes and one for the payload, where a ring allgather would take N-1.
  const std::vector<std::span<const uint8_t>> to_each(static_cast<size_t>(n), buffers.message);
  buffers.release_received();
  buffers.received = context.comm.alltoallv(to_each, context.timeout);
  context.clock.lap(Phase::kCollective);
  validate_messages(context, "reduced region message", kEveryRank);
  // Owner p may only send sums of region p: otherwise positions would be applied twice and the
  // hand-back would be wrong. Checked before anything is written.
  for (int p = 0; p < n; ++p) {
    check_region(buffers.validated[p], layout, bounds, p, "its", "reduced region message", p,
                 context.iteration, nullptr);
  }
  context.clock.lap(Phase::kValidate);
  return {0, sent};
}

void rebalance_regions(SparseAllreduceState& state, std::span<const std::vector<uint64_t>> applied,
                       std::span<const uint64_t> offsets, int interval, int world_size) {
  if (++state.runs % static_cast<uint64_t>(interval) == 1 || interval == 1) {
    size_t count = 0;
    for (const auto& positions : applied) count += positions.size();
    std::vector<uint64_t> applied_global;
    applied_global.reserve(count);
    for (size_t i = 0; i < applied.size(); ++i) {
      for (uint64_t index : applied[i]) applied_global.push_back(offsets[i] + index);
    }
    state.bounds = sparse::balanced_bounds(applied_global, offsets.back(), world_size);
  }
}

}  // namespace dgc

namespace dgc::sparse {

std::vector<uint64_t> equal_bounds(uint64_t total, int parts) {
  DGC_CHECK_GE(parts, 1, "regions");
  std::vector<uint64_t> bounds(static_cast<size_t>(parts) + 1);
  const auto p = static_cast<uint64_t>(parts);
  for (uint64_t i = 0; i <= p; ++i) {
    // total * i / p without overflow for total < 2^63.
    bounds[i] = (total / p) * i + (total % p) * i / p;
  }
  return bounds;
}

std::vector<uint64_t> balanced_bounds(std::span<const uint64_t> sorted_indices, uint64_t total,
                                      int parts) {
  DGC_CHECK_GE(parts, 1, "regions");
  if (sorted_indices.empty()) return equal_bounds(total, parts);
  const size_t n = sorted_indices.size();
  std::vector<uint64_t> bounds(static_cast<size_t>(parts) + 1);
  bounds[0] = 0;
  bounds[parts] = total;
  for (int p = 1; p < parts; ++p) {
    const size_t at = n * static_cast<size_t>(p) / static_cast<size_t>(parts);
    bounds[p] = at < n ? sorted_indices[at] : total;
    bounds[p] = std::max(bounds[p], bounds[p - 1]);
  }
  return bounds;
}

uint64_t reduce_sorted(std::span<const std::vector<Entry>> streams, std::vector<Entry>& out) {
  out.clear();
  uint64_t contributions = 0;
  for (const auto& s : streams) contributions += s.size();
  out.reserve(contributions);
  // k-way merge; ties broken by stream number so that values add in stream order.
  using Head = std::pair<uint64_t, size_t>;  // (index, stream)
  std::priority_queue<Head, std::vector<Head>, std::greater<>> heads;
  std::vector<size_t> position(streams.size(), 0);
  for (size_t s = 0; s < streams.size(); ++s) {
    if (!streams[s].empty()) heads.emplace(streams[s][0].index, s);
  }
  while (!heads.empty()) {
    const auto [index, s] = heads.top();
    heads.pop();
    const float value = streams[s][position[s]].value;
    if (!out.empty() && out.back().index == index) {
      out.back().value += value;
    } else {
      out.push_back({index, value});
    }
    if (++position[s] < streams[s].size()) heads.emplace(streams[s][position[s]].index, s);
  }
  return contributions;
}

uint64_t quota(uint64_t contributions, int world_size) {
  DGC_CHECK_GE(world_size, 1, "world size");
  const auto n = static_cast<uint64_t>(world_size);
  return (contributions + n - 1) / n;
}

void keep_largest(std::vector<Entry>& entries, uint64_t quota) {
  if (quota >= entries.size()) return;
  auto larger = [](const Entry& a, const Entry& b) {
    const float ma = std::fabs(a.value), mb = std::fabs(b.value);
    return ma != mb ? ma > mb : a.index < b.index;
  };
  std::nth_element(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(quota),
                   entries.end(), larger);
  entries.resize(quota);
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.index < b.index; });
}

void hand_back(const Selection& selected, std::span<const uint64_t> applied, Selection& unapplied) {
  size_t w = 0;
  for (size_t j = 0; j < selected.indices.size(); ++j) {
    while (w < applied.size() && applied[w] < selected.indices[j]) ++w;
    if (w == applied.size() || applied[w] != selected.indices[j]) {
      unapplied.indices.push_back(selected.indices[j]);
      unapplied.values.push_back(selected.values[j]);
    }
  }
}

}  // namespace dgc::sparse
