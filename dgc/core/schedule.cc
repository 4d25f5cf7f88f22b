#include "dgc/core/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dgc/core/error.h"
#include "dgc/core/selection.h"

namespace dgc {

double density_at(const DensitySchedule& schedule, int64_t iteration,
                  int64_t iterations_per_epoch) {
  check_density(schedule.after_warmup);
  DGC_CHECK_GT(iterations_per_epoch, 0, "iterations per epoch must be positive");
  DGC_CHECK_GE(iteration, 0, "iterations count from 0");
  DGC_CHECK_GE(schedule.iterations_per_stage, 0, "iterations_per_stage must not be negative");
  const double warmup_iterations =
      schedule.warmup_epochs * static_cast<double>(iterations_per_epoch);
  if (static_cast<double>(iteration) >= warmup_iterations) return schedule.after_warmup;
  const int64_t stage_length =
      schedule.iterations_per_stage > 0 ? schedule.iterations_per_stage : iterations_per_epoch;
  // 0.25^(s+1) = 2^(-2(s+1)): exact in binary; past s = 600 it is 0 anyway.
  const int64_t stage = std::min<int64_t>(iteration / stage_length, 600);
  const double warm = std::ldexp(1.0, -2 * static_cast<int>(stage + 1));
  return std::max(schedule.after_warmup, warm);
}

double lr_at(const LearningRateSchedule& schedule, int64_t iteration,
             int64_t iterations_per_epoch) {
  DGC_CHECK_GT(iterations_per_epoch, 0, "iterations per epoch must be positive");
  DGC_CHECK_GE(iteration, 0, "iterations count from 0");
  DGC_CHECK(schedule.warmup_start >= 0.0 && schedule.warmup_start <= 1.0,
            "warmup_start is a fraction of lr in [0, 1], got ", schedule.warmup_start);
  const double per_epoch = static_cast<double>(iterations_per_epoch);
  const double it = static_cast<double>(iteration);
  double lr = schedule.base;
  switch (schedule.decay) {
    case LearningRateSchedule::Decay::kConstant:
      break;
    case LearningRateSchedule::Decay::kCosine:
      if (schedule.total_epochs > schedule.warmup_epochs) {
        const double span = (schedule.total_epochs - schedule.warmup_epochs) * per_epoch;
        const double progress =
            std::clamp((it - schedule.warmup_epochs * per_epoch) / span, 0.0, 1.0);
        lr *= 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      }
      break;
    case LearningRateSchedule::Decay::kStep:
      for (double milestone : schedule.step_epochs) {
        if (milestone > 0.0 && it >= milestone * per_epoch) lr *= schedule.step_gamma;
      }
      break;
  }
  const double warmup_iterations = schedule.warmup_epochs * per_epoch;
  if (it < warmup_iterations) {
    const double ramp =
        schedule.warmup_start > 0.0
            ? schedule.warmup_start + (1.0 - schedule.warmup_start) * it / warmup_iterations
            : (it + 1.0) / warmup_iterations;
    lr *= std::min(1.0, ramp);
  }
  return lr;
}

}  // namespace dgc
