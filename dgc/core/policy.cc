#include "dgc/core/policy.h"

#include "dgc/core/error.h"

namespace dgc {

TensorPath choose_path(std::span<const int64_t> shape, const PolicyOptions& options) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    DGC_CHECK_GE(dim, 0, "tensor dimensions cannot be negative");
    numel *= dim;
  }
  const bool shaped = shape.size() > 1 || (options.compress_1d && shape.size() == 1);
  return shaped && numel >= options.min_numel ? TensorPath::kCompressed : TensorPath::kDense;
}

}  // namespace dgc
