// Local gradient clipping (docs/algorithm.md step 1): clip by the L2 norm over all of one worker's
// gradients, with a threshold scaled by N^-1/2, before the gradient is accumulated.
#pragma once

#include <span>
#include <string>

#include "dgc/core/names.h"

namespace dgc {

// Which gradient the N^-1/2 threshold applies to. Both clip the worker's local mean gradient g
// (the average over its own batch); they differ in the limit that puts on ||g||.
enum class ClipScaling {
  // The paper's Algorithm 1 (the default): each worker accumulates its share g / N of the summed
  // gradient and clips that share at max_norm / sqrt(N), i.e. ||g|| <= max_norm * sqrt(N). With
  // independent worker gradients the average then has about the norm max_norm that dense training
  // allows, which is the reason for the N^-1/2.
  kPaper,
  // docs/algorithm.md step 1 read with g the local mean gradient: ||g|| <= max_norm / sqrt(N).
  // The average of N such gradients has a norm between max_norm / N and max_norm / sqrt(N):
  // sqrt(N) to N times tighter than dense training whenever clipping acts.
  kMeanGradient,
};

// "paper" or "mean"; parse_clip_scaling throws dgc::InvalidArgument on anything else.
inline constexpr EnumNames<ClipScaling, 2> kClipScalingNames = {
    {{ClipScaling::kPaper, "paper"}, {ClipScaling::kMeanGradient, "mean"}}};
std::string to_string(ClipScaling scaling);
ClipScaling parse_clip_scaling(const std::string& name);

// The limit on the L2 norm of one worker's local mean gradient: max_norm * sqrt(world_size)
// (kPaper) or max_norm / sqrt(world_size) (kMeanGradient). max_norm <= 0 gives 0 (no clipping).
double local_clip_limit(double max_norm, int world_size, ClipScaling scaling);

// Sum of squares, accumulated in double.
double squared_norm(std::span<const float> values);

// The factor every gradient is multiplied by: min(1, limit / norm), where
// norm = sqrt(total_squared_norm). limit <= 0 disables clipping (returns 1).
// Throws dgc::NumericError if total_squared_norm is not finite.
double clip_coefficient(double total_squared_norm, double limit);

// Multiplies `values` by `coefficient` in place.
void scale(std::span<float> values, float coefficient);

}  // namespace dgc
