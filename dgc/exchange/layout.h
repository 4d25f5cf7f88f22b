// The layout of a model as the exchange sees it: every tensor with its path (compressed or
// dense). Not collective; no communication. The handshake (handshake.h) checks that every rank
// has the same layout.
#pragma once

#include <cstdint>
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

}  // namespace dgc
