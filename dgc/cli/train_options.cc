// dgc train's options (train_command.h): the flags parsed into TrainOptions, the task's defaults
// for the flags not given, the --set settings, and the checks across them, each in one place.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "dgc/cli/train_command.h"
#include "dgc/core/error.h"
#include "dgc/train/exchange_choice.h"

namespace dgc::cli {
namespace {

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// The deprecated spellings of experiment settings still work; say what replaces them.
void warn_deprecated(const TrainCommand& cmd, const CLI::App& sub) {
  const auto dense_path = train::parse_dense_path(cmd.dense_path);
  const bool sixteen_bit =
      dense_path == train::DensePath::kFloat16 || dense_path == train::DensePath::kBFloat16;
  if (sub.count("--dense-path") > 0 && sixteen_bit) {
    std::fprintf(stderr, "dgc train: --dense-path %s is deprecated: use --set dense_path=%s\n",
                 cmd.dense_path.c_str(), cmd.dense_path.c_str());
  }
  if (sub.count("--clip-scaling") > 0) {
    std::fprintf(stderr, "dgc train: --clip-scaling is deprecated: use --set clip_scaling=%s\n",
                 cmd.clip_scaling.c_str());
  }
  if (sub.count("--lr-in-velocity") > 0) {
    std::fprintf(stderr, "dgc train: --lr-in-velocity is deprecated: use --set lr_in_velocity=1\n");
  }
}

}  // namespace

train::TrainOptions resolve_options(TrainCommand& cmd, const CLI::App& sub) {
  check_task_flags(cmd, sub);
  train::TrainOptions options = cmd.options;
  auto& opt = options.optimizer;
  const std::vector<std::string> settings = apply_settings(cmd, sub, options);
  warn_deprecated(cmd, sub);
  opt.compression = train::parse_compression(cmd.compression);
  opt.compressor.selection.method = parse_name(kSelectionMethodNames, cmd.selection, "--selection");
  opt.compressor.value_type = parse_value_type(cmd.value_type);
  opt.clip_scaling = parse_clip_scaling(cmd.clip_scaling);
  opt.exchange = parse_exchange_algorithm(cmd.exchange);
  opt.dense_path = train::parse_dense_path(cmd.dense_path);
  opt.selection_scope = train::parse_selection_scope(cmd.selection_scope);
  opt.on_nonfinite = train::parse_nonfinite_policy(cmd.on_nonfinite);
  opt.lr.decay = parse_name(kLrDecayNames, cmd.lr_decay, "--lr-decay");
  options.lr_scaling = parse_name(train::kLrScalingNames, cmd.lr_scaling, "--lr-scaling");
  apply_task_defaults(task_entry(cmd.task).defaults(), sub, options);

  if (options.lr_scaling != train::LrScaling::kNone && options.lr_reference_batch <= 0) {
    throw InvalidArgument(
        detail::concat("--lr-scaling ", train::to_string(options.lr_scaling),
                       " needs the global batch --lr is meant for: add --lr-batch B (for example ",
                       4 * options.batch_size, ", 4 workers' worth)"));
  }
  if (sub.count("--lr-batch") > 0 && options.lr_scaling == train::LrScaling::kNone) {
    throw InvalidArgument(
        "--lr-batch is the global batch --lr is meant for under --lr-scaling: add "
        "--lr-scaling sqrt (or linear), or drop it");
  }
  if (!options.exchange_link.empty()) {
    if (opt.exchange != ExchangeAlgorithm::kAuto || opt.compression != train::Compression::kDgc) {
      throw InvalidArgument(
          "--link is what --exchange auto plans with: add --exchange auto (DGC), or drop it");
    }
    // A clear error now rather than at start-up; a slow link pipelines unless told otherwise.
    const sim::Link link = train::parse_link(options.exchange_link);
    if (train::pipelined_by_default(link) && sub.count("--pipeline") == 0 &&
        !options.residual_stats && opt.on_nonfinite != train::NonFinitePolicy::kSkip) {
      opt.pipeline = 1;
    }
  }
  // Pipelined, Nesterov momentum unless a momentum form is given: one step late it is stable at
  // 2.5 times heavy ball's learning rate (docs/training.md, the pipelined step).
  if (opt.pipeline != 0 && sub.count("--nesterov") == 0 && sub.count("--no-nesterov") == 0) {
    opt.compressor.momentum.nesterov = true;
  }
  if (opt.pipeline != 0 && options.residual_stats) {
    throw InvalidArgument(
        "--residual-stats reads each step's selections, which --pipeline 1 is still computing "
        "while the next step runs: drop one of them");
  }
  train::check_pipeline(opt);
  if (sub.count("--lr-batch-limit") > 0 && options.lr_scaling == train::LrScaling::kNone) {
    throw InvalidArgument(
        "--lr-batch-limit is where the --lr-scaling rule stops: add --lr-scaling sqrt (or "
        "linear), or drop it");
  }

  if (opt.selection_scope == train::SelectionScope::kGlobal) {
    const bool scope_given = sub.count("--selection-scope") > 0;
    if (opt.compression != train::Compression::kDgc) {
      throw InvalidArgument(
          "--selection-scope global is how DGC selects (dense training sends everything): use it "
          "with --compression dgc, or drop it");
    }
    std::vector<std::string> given;
    for (const char* flag :
         {"--dense-path", "--dense-path-density", "--min-compress-numel", "--compress-1d"}) {
      if (sub.count(flag) > 0) given.emplace_back(flag);
    }
    if (contains(settings, "dense_path")) given.emplace_back("--set dense_path");
    if (!given.empty()) {
      throw InvalidArgument(
          detail::concat(given.front(),
                         " chooses how the tensors left out of compression travel, and with "
                         "--selection-scope global",
                         scope_given ? "" : " (the " + cmd.task + " default)",
                         " none is: every tensor is selected at --density; drop ", given.front(),
                         " or add --selection-scope tensor"));
    }
  }
  if (sub.count("--max-consecutive-skips") > 0 &&
      opt.on_nonfinite != train::NonFinitePolicy::kSkip) {
    throw InvalidArgument(
        "--max-consecutive-skips bounds --on-nonfinite skip: add --on-nonfinite skip, or drop it");
  }
  if (opt.lr_in_velocity && opt.compression != train::Compression::kDgc) {
    throw InvalidArgument(
        "--set lr_in_velocity changes how DGC accumulates (dense training has no velocity): use "
        "it with --compression dgc, or drop it");
  }
  const bool step_decay = opt.lr.decay == LearningRateSchedule::Decay::kStep;
  if (step_decay && opt.lr.step_epochs[0] <= 0.0) {
    throw InvalidArgument(
        "--set lr_decay=step needs its milestones: add --set lr_step_epochs=E1[,E2,...]");
  }
  if (!step_decay &&
      (contains(settings, "lr_step_epochs") || contains(settings, "lr_step_gamma"))) {
    throw InvalidArgument(
        "--set lr_step_epochs and lr_step_gamma shape the step decay: add --set lr_decay=step, or "
        "drop them");
  }
  opt.compressor.seed = options.seed;
  DGC_CHECK(cmd.timeout_seconds > 0, "--timeout must be positive");
  opt.timeout = comm::Timeout(static_cast<int64_t>(cmd.timeout_seconds * 1000));
  if (sub.count("--resume") > 0) {
    if (cmd.resume != "" && cmd.resume != "auto") {
      throw InvalidArgument("--resume takes no value or 'auto', not '" + cmd.resume + "'");
    }
    if (cmd.resume == "auto" && sub.count("--resume-step") > 0) {
      throw InvalidArgument("--resume auto picks the step itself: drop --resume-step");
    }
    options.resume_auto = cmd.resume == "auto";
    options.resume = !options.resume_auto;
  }
  if (sub.count("--resume-step") > 0) options.resume = true;
  if (options.resume_auto && options.checkpoint.empty()) {
    throw InvalidArgument(
        "--resume auto needs --checkpoint PATH (where the run writes and finds its checkpoints)");
  }
  if (options.resume && options.checkpoint.empty()) {
    throw InvalidArgument("--resume needs --checkpoint PATH (the prefix the run wrote)");
  }
  if (options.checkpoint.empty() &&
      (sub.count("--checkpoint-every") > 0 || sub.count("--checkpoint-keep") > 0)) {
    throw InvalidArgument("--checkpoint-every and --checkpoint-keep need --checkpoint PATH");
  }
  return options;
}

}  // namespace dgc::cli
