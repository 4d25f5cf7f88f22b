// Which tensors are compressed and which go dense (docs/algorithm.md "Tensors that are not
// compressed").
#pragma once

#include <cstdint>
#include <span>

namespace dgc {

enum class TensorPath : uint8_t { kDense = 0, kCompressed = 1 };

struct PolicyOptions {
  // Tensors with fewer elements than this go dense; worth it below roughly 2/density.
  int64_t min_numel = 1024;
  // Tensors with one dimension (biases, norm parameters) go dense unless this is set.
  bool compress_1d = false;
};

// Compressed iff (shape has more than one dimension or compress_1d) and numel >= min_numel.
TensorPath choose_path(std::span<const int64_t> shape, const PolicyOptions& options);

}  // namespace dgc
