// Momentum correction and momentum factor masking on plain buffers (docs/algorithm.md steps 2
// and 5).
//
// Buffers are caller-owned spans of equal length; nothing is retained after a call returns.
// Not thread-safe on overlapping buffers; callers may split one tensor into disjoint ranges.
#pragma once

#include <cstdint>
#include <span>

#include "dgc/core/options.h"

namespace dgc {

// One pass over the tensor:
//   plain:    u = m*u + g;      v = v + u
//   Nesterov: u = m*(u + g);    v = v + u + g
// `momentum` is u, `velocity` is v (the accumulated, not yet sent update), `grad` is g.
void accumulate_velocity(std::span<float> momentum, std::span<float> velocity,
                         std::span<const float> grad, const MomentumOptions& options);

// Momentum factor masking at the sent positions `indices` (any order, each < size):
//   v[i] -= sent[i]   (sent[i] is the value as the receivers decode it; for fp32 this makes v[i] 0)
//   u[i] = 0          (only if options.masking)
// `sent` has one value per index. Passing the decoded value keeps fp16/bf16 rounding error in the
// residual, so nothing is lost.
void mask_sent(std::span<float> momentum, std::span<float> velocity,
               std::span<const uint32_t> indices, std::span<const float> sent,
               const MomentumOptions& options);

}  // namespace dgc
