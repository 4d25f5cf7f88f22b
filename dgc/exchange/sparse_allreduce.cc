#include "dgc/exchange/sparse_allreduce.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "dgc/core/error.h"

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

}  // namespace dgc::sparse
