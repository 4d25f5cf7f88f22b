#include "dgc/exchange/layout.h"

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

}  // namespace dgc
