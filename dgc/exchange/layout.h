// The layout of a model as the exchange sees it: every tensor with its path (compressed or
// dense), and the index built from it that the exchange and its algorithms read (which tensors
// are compressed, which dense, and the global index space of the compressed ones). Not
// collective; no communication. The handshake (handshake.h) checks that every rank has the same
// layout.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dgc/core/policy.h"

namespace dgc {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorPath path = TensorPath::kDense;
  int64_t numel() const;
};

// Builds the layout of a model: path chosen by the policy for each (name, shape), order kept.
std::vector<TensorSpec> make_layout(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
    const PolicyOptions& policy);

// A layout split by path. "Compressed tensor i" everywhere in the exchange (selections, update
// buffers, codec tensor ids) is layout tensor compressed[i].
struct LayoutIndex {
  std::vector<size_t> compressed;  // indices into the layout of the compressed tensors, in order
  std::vector<size_t> dense;       // ... of the dense tensors, in order
  std::vector<uint64_t> compressed_numels;  // elements of compressed tensor i
  // The global index space: the compressed tensors concatenated in layout order. offsets[i] is
  // the global index of compressed tensor i's first element; offsets.back() is their total
  // (size compressed.size() + 1).
  std::vector<uint64_t> offsets;
  uint64_t dense_numel = 0;  // elements of all dense-path tensors
  uint64_t total_numel = 0;  // elements of all tensors
  // The position in `compressed` of the dense-path group (ExchangeOptions::dense_path_group).
  std::optional<size_t> dense_path_group;
};

// Indexes `layout`. `dense_path_group`, if any, is an index into the layout that must name a
// compressed tensor. Throws dgc::InvalidArgument for a negative dimension, a compressed tensor
// of more than 2^32 elements (indices are 32-bit) or a dense-path group that is not compressed.
LayoutIndex index_layout(std::span<const TensorSpec> layout,
                         std::optional<size_t> dense_path_group = std::nullopt);

}  // namespace dgc
