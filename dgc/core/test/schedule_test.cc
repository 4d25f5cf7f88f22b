// Warm-up schedules (schedule.h).
#include "dgc/core/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "dgc/core/error.h"

namespace dgc {
namespace {

TEST(DensitySchedule, PaperWarmupIsExactPerEpoch) {
  DensitySchedule s;
  s.after_warmup = 0.001;
  s.warmup_epochs = 4;
  const int64_t per_epoch = 100;
  const double expected[] = {0.25, 0.0625, 0.015625, 0.00390625};
  for (int e = 0; e < 4; ++e) {
    for (int64_t it : {e * per_epoch, e * per_epoch + 37, e * per_epoch + per_epoch - 1}) {
      EXPECT_EQ(density_at(s, it, per_epoch), expected[e]) << "iteration " << it;
    }
  }
  EXPECT_EQ(density_at(s, 400, per_epoch), 0.001);
  EXPECT_EQ(density_at(s, 1000000, per_epoch), 0.001);
}

TEST(DensitySchedule, NeverBelowFinalDensity) {
  DensitySchedule s;
  s.after_warmup = 0.01;
  s.warmup_epochs = 6;
  // 0.25^4 = 0.0039 < 0.01: stages 3.. give d.
  EXPECT_EQ(density_at(s, 2 * 10, 10), 0.015625);
  EXPECT_EQ(density_at(s, 3 * 10, 10), 0.01);
  EXPECT_EQ(density_at(s, 5 * 10 + 9, 10), 0.01);
}

TEST(DensitySchedule, NoWarmupIsConstant) {
  DensitySchedule s;
  EXPECT_EQ(density_at(s, 0, 10), 0.001);
  EXPECT_EQ(density_at(s, 12345, 10), 0.001);
}

TEST(DensitySchedule, PerIterationStages) {
  DensitySchedule s;
  s.after_warmup = 0.001;
  s.warmup_epochs = 1;
  s.iterations_per_stage = 10;
  const int64_t per_epoch = 50;
  const double expected[] = {0.25, 0.0625, 0.015625, 0.00390625, 0.001};  // 0.25^5 < d
  for (int64_t it = 0; it < per_epoch; ++it) {
    EXPECT_EQ(density_at(s, it, per_epoch), expected[it / 10]) << it;
  }
  EXPECT_EQ(density_at(s, per_epoch, per_epoch), 0.001);
}

TEST(DensitySchedule, FractionalWarmup) {
  DensitySchedule s;
  s.warmup_epochs = 1.5;
  EXPECT_EQ(density_at(s, 99, 100), 0.25);
  EXPECT_EQ(density_at(s, 100, 100), 0.0625);
  EXPECT_EQ(density_at(s, 149, 100), 0.0625);
  EXPECT_EQ(density_at(s, 150, 100), 0.001);
}

TEST(DensitySchedule, RejectsBadArguments) {
  DensitySchedule s;
  EXPECT_THROW(density_at(s, 0, 0), InvalidArgument);
  EXPECT_THROW(density_at(s, -1, 10), InvalidArgument);
  s.after_warmup = 0.0;
  EXPECT_THROW(density_at(s, 0, 10), InvalidArgument);
}

TEST(LearningRate, LinearWarmupFromLrOverSteps) {
  LearningRateSchedule s;
  s.base = 0.1;
  s.warmup_epochs = 2;
  s.decay = LearningRateSchedule::Decay::kConstant;
  const int64_t per_epoch = 10;  // 20 warm-up steps
  for (int64_t it = 0; it < 20; ++it) {
    EXPECT_DOUBLE_EQ(lr_at(s, it, per_epoch), 0.1 * (it + 1) / 20.0) << it;
  }
  EXPECT_DOUBLE_EQ(lr_at(s, 0, per_epoch), 0.005);
  EXPECT_DOUBLE_EQ(lr_at(s, 19, per_epoch), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 20, per_epoch), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 1000, per_epoch), 0.1);
}

TEST(LearningRate, WarmupFromAStartFraction) {
  LearningRateSchedule s;
  s.base = 0.2;
  s.warmup_epochs = 1;
  s.warmup_start = 0.1;
  s.decay = LearningRateSchedule::Decay::kConstant;
  EXPECT_DOUBLE_EQ(lr_at(s, 0, 10), 0.02);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 10), 0.2 * (0.1 + 0.9 * 0.5));
  EXPECT_DOUBLE_EQ(lr_at(s, 10, 10), 0.2);
}

TEST(LearningRate, CosineDecayAfterWarmup) {
  LearningRateSchedule s;
  s.base = 0.1;
  s.warmup_epochs = 0;
  s.total_epochs = 10;
  const int64_t per_epoch = 10;
  EXPECT_DOUBLE_EQ(lr_at(s, 0, per_epoch), 0.1);
  EXPECT_NEAR(lr_at(s, 50, per_epoch), 0.05, 1e-15);
  EXPECT_NEAR(lr_at(s, 25, per_epoch), 0.05 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_NEAR(lr_at(s, 100, per_epoch), 0.0, 1e-15);
  EXPECT_NEAR(lr_at(s, 150, per_epoch), 0.0, 1e-15);  // stays at 0 past the end
  // With warm-up the cosine spans the rest.
  s.warmup_epochs = 2;
  EXPECT_DOUBLE_EQ(lr_at(s, 20, per_epoch), 0.1);
  EXPECT_NEAR(lr_at(s, 60, per_epoch), 0.05, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(s, 9, per_epoch), 0.1 * 10 / 20.0);  // ramp, no decay yet
}

TEST(LearningRate, CosineWithoutTotalIsConstant) {
  LearningRateSchedule s;  // default decay is cosine, total_epochs 0
  EXPECT_DOUBLE_EQ(lr_at(s, 0, 10), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 100000, 10), 0.1);
}

TEST(LearningRate, StepDecayAtMilestones) {
  LearningRateSchedule s;
  s.base = 1.0;
  s.decay = LearningRateSchedule::Decay::kStep;
  s.step_gamma = 0.1;
  s.step_epochs[0] = 3;
  s.step_epochs[1] = 6;
  const int64_t per_epoch = 100;
  EXPECT_DOUBLE_EQ(lr_at(s, 299, per_epoch), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 300, per_epoch), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 599, per_epoch), 0.1);
  EXPECT_NEAR(lr_at(s, 600, per_epoch), 0.01, 1e-17);
  EXPECT_NEAR(lr_at(s, 10000, per_epoch), 0.01, 1e-17);
}

TEST(LearningRate, RejectsBadArguments) {
  LearningRateSchedule s;
  EXPECT_THROW(lr_at(s, 0, 0), InvalidArgument);
  EXPECT_THROW(lr_at(s, -1, 1), InvalidArgument);
  s.warmup_start = 1.5;
  EXPECT_THROW(lr_at(s, 0, 1), InvalidArgument);
}

}  // namespace
}  // namespace dgc
