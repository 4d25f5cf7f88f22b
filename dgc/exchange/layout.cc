#include "dgc/exchange/layout.h"

#include <algorithm>
#include <limits>

#include "dgc/core/error.h"

namespace dgc {

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

LayoutIndex index_layout(std::span<const TensorSpec> layout,
                         std::optional<size_t> dense_path_group) {
  LayoutIndex index;
  uint64_t compressed_total = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto& t = layout[i];
    for (int64_t d : t.shape) {
      DGC_CHECK_GE(d, 0, "tensor '", t.name, "' has a negative dimension");
    }
    const auto numel = static_cast<uint64_t>(t.numel());
    index.total_numel += numel;
    if (t.path == TensorPath::kCompressed) {
      DGC_CHECK_LE(numel, uint64_t{std::numeric_limits<uint32_t>::max()} + 1, "compressed tensor '",
                   t.name, "' is too large for 32-bit indices");
      index.compressed.push_back(i);
      index.compressed_numels.push_back(numel);
      index.offsets.push_back(compressed_total);
      compressed_total += numel;
    } else {
      index.dense.push_back(i);
      index.dense_numel += numel;
    }
  }
  index.offsets.push_back(compressed_total);
  if (dense_path_group) {
    const size_t g = *dense_path_group;
    const auto at = std::find(index.compressed.begin(), index.compressed.end(), g);
    DGC_CHECK(at != index.compressed.end(),
              "the dense-path group must be a compressed tensor of the layout; found index ", g,
              " of ", layout.size());
    index.dense_path_group = static_cast<size_t>(at - index.compressed.begin());
  }
  return index;
}

}  // namespace dgc
