// Local gradient clipping (DGC.md step 1): clip by the L2 norm over all of one worker's gradients
// with threshold max_norm / sqrt(world_size), before the gradient is accumulated.
#pragma once

#include <span>

namespace dgc {

// Sum of squares, accumulated in double.
double squared_norm(std::span<const float> values);

// The factor every gradient is multiplied by: min(1, (max_norm / sqrt(world_size)) / norm),
// where norm = sqrt(total_squared_norm). max_norm <= 0 disables clipping (returns 1).
// Throws dgc::NumericError if total_squared_norm is not finite.
double clip_coefficient(double total_squared_norm, double max_norm, int world_size);

// Multiplies `values` by `coefficient` in place.
void scale(std::span<float> values, float coefficient);

}  // namespace dgc
