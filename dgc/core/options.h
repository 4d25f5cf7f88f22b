// Options structs for the compression core. Every field has a documented default; the command
// line maps flags onto these one to one (see dgc/cli).
#pragma once

#include <cstdint>
#include <string_view>

#include "dgc/core/names.h"

namespace dgc {

// How the threshold for the top-`k` magnitudes is chosen (docs/algorithm.md, "Threshold
// selection").
enum class SelectionMethod : uint8_t {
  kSampled = 0,  // strided sample, 0.8k/1.3k adaptation, hierarchical exact top-k (the paper's)
  kExact = 1,    // exact top-k by nth_element over the whole tensor (reference and option)
};

// "sampled" | "exact", as `--selection` and the settings lines name them.
inline constexpr EnumNames<SelectionMethod, 2> kSelectionMethodNames = {
    {{SelectionMethod::kSampled, "sampled"}, {SelectionMethod::kExact, "exact"}}};

struct SelectionOptions {
  SelectionMethod method = SelectionMethod::kSampled;
  // Fraction of the tensor sampled to estimate the threshold; never fewer than ceil(2/density)
  // samples (and never more than the tensor).
  double sample_ratio = 0.01;
  // Accept the sampled threshold when the count is within [lower*k, upper*k].
  double lower_ratio = 0.8;
  double upper_ratio = 1.3;
  // When the count is below lower*k: threshold *= decay, count again, at most max_rounds times.
  double threshold_decay = 0.8;
  int max_rounds = 10;
};

struct MomentumOptions {
  double factor = 0.9;    // m
  bool nesterov = false;  // u = m*(u + g); v += u + g   (otherwise u = m*u + g; v += u)
  bool masking = true;    // momentum factor masking: zero u where v was sent
};

// Wire representation of the values of selected elements.
enum class ValueType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// "fp32", "fp16", "bf16": the names used by flags, settings and messages.
inline constexpr EnumNames<ValueType, 3> kValueTypeNames = {
    {{ValueType::kFloat32, "fp32"}, {ValueType::kFloat16, "fp16"}, {ValueType::kBFloat16, "bf16"}}};
const char* to_string(ValueType type);
// The inverse of to_string; anything else throws dgc::InvalidArgument listing the valid names.
ValueType parse_value_type(std::string_view name);

// The compressor's options. The density is not one of them: each step passes its own (the
// schedule's, DensitySchedule), so that the warm-up needs no second source of truth.
struct CompressionOptions {
  MomentumOptions momentum;
  SelectionOptions selection;
  ValueType value_type = ValueType::kFloat32;
  // Threads used for one large tensor. Results do not depend on it (sampling is seeded).
  int threads = 1;
  // Tensors below this many elements are processed by one thread even when threads > 1.
  int64_t min_numel_per_thread = 1 << 16;
  uint64_t seed = 0;  // seeds the random start of the strided sample
};

}  // namespace dgc
