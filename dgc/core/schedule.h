// Warm-up schedules (docs/algorithm.md "Warm-up"): exponentially rising sparsity and a linear
// learning-rate ramp. Pure functions of the training position; no state.
#pragma once

#include <cstdint>

#include "dgc/core/names.h"

namespace dgc {

struct DensitySchedule {
  double after_warmup = 0.001;  // d: the density once the warm-up is over
  double warmup_epochs = 0.0;   // warm-up length in epochs (the paper: 4 of 164, 1 of 40 ...)
  // Stage length in iterations. 0: one stage per epoch (the paper's). > 0: density changes every
  // `iterations_per_stage` iterations instead (the "per iteration" setting).
  int64_t iterations_per_stage = 0;
};

// Density in warm-up stage s (0-based): max(d, 0.25^(s+1)); d once warm-up is over.
// With iterations_per_stage == 0, s = floor(iteration / iterations_per_epoch) and warm-up covers
// iterations < warmup_epochs * iterations_per_epoch. With iterations_per_stage > 0,
// s = floor(iteration / iterations_per_stage) over the same warm-up span.
double density_at(const DensitySchedule& schedule, int64_t iteration, int64_t iterations_per_epoch);

struct LearningRateSchedule {
  double base = 0.1;           // the base learning rate (after warm-up)
  double warmup_epochs = 0.0;  // linear ramp length in epochs (Goyal et al.)
  double warmup_start = 0.0;   // ramp starts at warmup_start * lr ... (0 = from lr / steps)
  enum class Decay : uint8_t { kConstant, kCosine, kStep } decay = Decay::kCosine;
  double total_epochs = 0.0;             // for cosine: lr decays to 0 at total_epochs
  double step_gamma = 0.1;               // for step: lr *= gamma at each milestone
  double step_epochs[4] = {0, 0, 0, 0};  // for step: milestones in epochs (0 = unused)
};

// "cosine" | "constant" | "step", as `--lr-decay` and the settings lines (lr_decay=) name them.
inline constexpr EnumNames<LearningRateSchedule::Decay, 3> kLrDecayNames = {
    {{LearningRateSchedule::Decay::kCosine, "cosine"},
     {LearningRateSchedule::Decay::kConstant, "constant"},
     {LearningRateSchedule::Decay::kStep, "step"}}};

// Learning rate at `iteration`: lr * decay(epoch) * ramp(iteration), epoch = iteration / ipe.
// ramp: during the first W = warmup_epochs * ipe iterations, (iteration + 1) / W when
//   warmup_start == 0 (Goyal et al.: lr / W at the first step, lr at the last), otherwise
//   warmup_start + (1 - warmup_start) * iteration / W; 1 afterwards.
// decay: kConstant 1; kCosine 0.5 * (1 + cos(pi * p)) with p the fraction of the span from
//   warmup_epochs to total_epochs that has passed (clamped to [0, 1]; no decay when
//   total_epochs <= warmup_epochs); kStep step_gamma^(number of milestones m > 0 with
//   epoch >= m).
double lr_at(const LearningRateSchedule& schedule, int64_t iteration, int64_t iterations_per_epoch);

}  // namespace dgc
