#include "dgc/train/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

// Shortest text that reads back as the same double ("0.01", not "0.01000000000000000021").
struct Num {
  double value;
};
std::ostream& operator<<(std::ostream& out, Num n) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), n.value);
  return out.write(text, result.ptr - text);
}

}  // namespace

Compression parse_compression(const std::string& name) {
  return parse_name(kCompressionNames, name, "compression");
}

std::string to_string(Compression compression) { return name_of(kCompressionNames, compression); }

DensePath parse_dense_path(const std::string& name) {
  return parse_name(kDensePathNames, name, "dense path");
}

std::string to_string(DensePath dense_path) { return name_of(kDensePathNames, dense_path); }

SelectionScope parse_selection_scope(const std::string& name) {
  return parse_name(kSelectionScopeNames, name, "selection scope");
}

std::string to_string(SelectionScope scope) { return name_of(kSelectionScopeNames, scope); }

NonFinitePolicy parse_nonfinite_policy(const std::string& name) {
  return parse_name(kNonFinitePolicyNames, name, "non-finite policy");
}

std::string to_string(NonFinitePolicy policy) { return name_of(kNonFinitePolicyNames, policy); }

void check_pipeline(const OptimizerOptions& o) {
  if (o.pipeline != 0 && o.pipeline != 1) {
    throw InvalidArgument(detail::concat("--pipeline must be 0 or 1, got ", o.pipeline));
  }
  if (o.pipeline != 0 && o.on_nonfinite == NonFinitePolicy::kSkip) {
    throw InvalidArgument(
        "--pipeline 1 cannot skip a step (--on-nonfinite skip): a non-finite gradient is known "
        "only once the next step has been computed; use --on-nonfinite stop, or drop --pipeline");
  }
}

std::string describe(const OptimizerOptions& o) {
  std::ostringstream out;
  const auto& c = o.compressor;
  out << "compression=" << to_string(o.compression) << "\n"
      << "momentum=" << Num{c.momentum.factor} << "\n"
      << "nesterov=" << c.momentum.nesterov << "\n"
      << "weight_decay=" << Num{o.weight_decay} << "\n"
      << "clip_norm=" << Num{o.clip_norm} << "\n"
      << "clip_scaling=" << to_string(o.clip_scaling) << "\n"
      << "lr=" << Num{o.lr.base} << "\n"
      << "lr_warmup_epochs=" << Num{o.lr.warmup_epochs} << "\n"
      << "lr_warmup_start=" << Num{o.lr.warmup_start} << "\n"
      << "lr_decay=" << name_of(kLrDecayNames, o.lr.decay) << "\n"
      << "lr_total_epochs=" << Num{o.lr.total_epochs} << "\n"
      << "lr_step_gamma=" << Num{o.lr.step_gamma} << "\n"
      << "lr_step_epochs=" << Num{o.lr.step_epochs[0]} << "," << Num{o.lr.step_epochs[1]} << ","
      << Num{o.lr.step_epochs[2]} << "," << Num{o.lr.step_epochs[3]} << "\n"
      << "iterations_per_epoch=" << o.iterations_per_epoch << "\n"
      << "max_consecutive_skips=" << o.max_consecutive_skips << "\n"
      << "on_nonfinite=" << to_string(o.on_nonfinite) << "\n";
  // Only when set, so that the synchronous runs' settings (and checkpoints) stay as they were.
  if (o.pipeline != 0) out << "pipeline=" << o.pipeline << "\n";
  if (o.compression == Compression::kDgc) {
    out << "density=" << Num{o.density.after_warmup} << "\n"
        << "warmup_epochs=" << Num{o.density.warmup_epochs} << "\n"
        << "warmup_stage_iterations=" << o.density.iterations_per_stage << "\n"
        << "masking=" << c.momentum.masking << "\n"
        << "selection=" << name_of(kSelectionMethodNames, c.selection.method) << "\n"
        << "sample_ratio=" << Num{c.selection.sample_ratio} << "\n"
        << "selection_bounds=" << Num{c.selection.lower_ratio} << ","
        << Num{c.selection.upper_ratio} << "," << Num{c.selection.threshold_decay} << ","
        << c.selection.max_rounds << "\n"
        << "value_type=" << dgc::to_string(c.value_type) << "\n"
        << "min_compress_numel=" << o.policy.min_numel << "\n"
        << "compress_1d=" << o.policy.compress_1d << "\n"
        << "exchange=" << dgc::to_string(o.exchange) << "\n"
        << "dense_path=" << to_string(o.dense_path) << "\n";
    // Only when on, so that checkpoints written before these settings existed still resume.
    if (o.lr_in_velocity) out << "lr_in_velocity=1\n";
    if (o.selection_scope == SelectionScope::kGlobal) out << "selection_scope=global\n";
    if (o.dense_path == DensePath::kGrouped && o.selection_scope == SelectionScope::kTensor) {
      out << "dense_path_density=" << Num{o.dense_path_density} << "\n";
    }
  }
  return out.str();
}

LrScaling parse_lr_scaling(const std::string& name) {
  return parse_name(kLrScalingNames, name, "learning-rate scaling");
}

std::string to_string(LrScaling scaling) { return name_of(kLrScalingNames, scaling); }

double scaled_learning_rate(double lr, LrScaling scaling, int64_t global_batch,
                            int64_t reference_batch, int64_t batch_limit) {
  DGC_CHECK_GE(global_batch, 1, "global batch");
  DGC_CHECK_GE(reference_batch, 1, "reference global batch of the learning rate");
  DGC_CHECK_GE(batch_limit, 0, "global batch limit of the learning-rate rule");
  const int64_t batch = batch_limit > 0 ? std::min(global_batch, batch_limit) : global_batch;
  const double ratio = static_cast<double>(batch) / static_cast<double>(reference_batch);
  switch (scaling) {
    case LrScaling::kNone:
      return lr;
    case LrScaling::kSqrt:
      return lr * std::sqrt(ratio);
    case LrScaling::kLinear:
      return lr * ratio;
  }
  return lr;
}

}  // namespace dgc::train
