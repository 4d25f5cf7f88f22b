#include "dgc/train/options.h"

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

const char* to_string(SelectionMethod method) {
  return method == SelectionMethod::kExact ? "exact" : "sampled";
}

const char* to_string(LearningRateSchedule::Decay decay) {
  switch (decay) {
    case LearningRateSchedule::Decay::kConstant:
      return "constant";
    case LearningRateSchedule::Decay::kStep:
      return "step";
    case LearningRateSchedule::Decay::kCosine:
      break;
  }
  return "cosine";
}

}  // namespace

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "dgc") return Compression::kDgc;
  throw InvalidArgument("unknown compression '" + name + "': expected none or dgc");
}

std::string to_string(Compression compression) {
  return compression == Compression::kNone ? "none" : "dgc";
}

DensePath parse_dense_path(const std::string& name) {
  if (name == "exact") return DensePath::kExact;
  if (name == "grouped") return DensePath::kGrouped;
  if (name == "fp16") return DensePath::kFloat16;
  if (name == "bf16") return DensePath::kBFloat16;
  throw InvalidArgument("unknown dense path '" + name + "': expected exact, grouped, fp16 or bf16");
}

std::string to_string(DensePath dense_path) {
  switch (dense_path) {
    case DensePath::kGrouped:
      return "grouped";
    case DensePath::kFloat16:
      return "fp16";
    case DensePath::kBFloat16:
      return "bf16";
    case DensePath::kExact:
      break;
  }
  return "exact";
}

SelectionScope parse_selection_scope(const std::string& name) {
  if (name == "tensor") return SelectionScope::kTensor;
  if (name == "global") return SelectionScope::kGlobal;
  throw InvalidArgument("unknown selection scope '" + name + "': expected tensor or global");
}

std::string to_string(SelectionScope scope) {
  return scope == SelectionScope::kGlobal ? "global" : "tensor";
}

NonFinitePolicy parse_nonfinite_policy(const std::string& name) {
  if (name == "stop") return NonFinitePolicy::kStop;
  if (name == "skip") return NonFinitePolicy::kSkip;
  throw InvalidArgument("unknown non-finite policy '" + name + "': expected stop or skip");
}

std::string to_string(NonFinitePolicy policy) {
  return policy == NonFinitePolicy::kSkip ? "skip" : "stop";
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
      << "lr_decay=" << to_string(o.lr.decay) << "\n"
      << "lr_total_epochs=" << Num{o.lr.total_epochs} << "\n"
      << "lr_step_gamma=" << Num{o.lr.step_gamma} << "\n"
      << "lr_step_epochs=" << Num{o.lr.step_epochs[0]} << "," << Num{o.lr.step_epochs[1]} << ","
      << Num{o.lr.step_epochs[2]} << "," << Num{o.lr.step_epochs[3]} << "\n"
      << "iterations_per_epoch=" << o.iterations_per_epoch << "\n"
      << "max_consecutive_skips=" << o.max_consecutive_skips << "\n"
      << "on_nonfinite=" << to_string(o.on_nonfinite) << "\n";
  if (o.compression == Compression::kDgc) {
    out << "density=" << Num{o.density.after_warmup} << "\n"
        << "warmup_epochs=" << Num{o.density.warmup_epochs} << "\n"
        << "warmup_stage_iterations=" << o.density.iterations_per_stage << "\n"
        << "masking=" << c.momentum.masking << "\n"
        << "selection=" << to_string(c.selection.method) << "\n"
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
  if (name == "none") return LrScaling::kNone;
  if (name == "sqrt") return LrScaling::kSqrt;
  if (name == "linear") return LrScaling::kLinear;
  throw InvalidArgument("unknown learning-rate scaling '" + name +
                        "': expected none, sqrt or linear");
}

std::string to_string(LrScaling scaling) {
  switch (scaling) {
    case LrScaling::kNone:
      return "none";
    case LrScaling::kSqrt:
      return "sqrt";
    case LrScaling::kLinear:
      return "linear";
  }
  return "?";
}

double scaled_learning_rate(double lr, LrScaling scaling, int64_t global_batch,
                            int64_t reference_batch) {
  DGC_CHECK_GE(global_batch, 1, "global batch");
  DGC_CHECK_GE(reference_batch, 1, "reference global batch of the learning rate");
  const double ratio = static_cast<double>(global_batch) / static_cast<double>(reference_batch);
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
