// The DGC step (compressor.h) against the plain reference step in reference.h, and the
// properties docs/algorithm.md promises: density 1 is momentum SGD, nothing is lost, threads do
// not matter.
#include "dgc/core/compressor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <sstream>
#include <tuple>
#include <vector>

#include "dgc/core/clip.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"
#include "dgc/core/test/reference.h"

namespace dgc {

// Readable parameter names in test listings.
void PrintTo(SelectionMethod method, std::ostream* os) {
  *os << (method == SelectionMethod::kExact ? "exact" : "sampled");
}
void PrintTo(ValueType type, std::ostream* os) {
  *os << (type == ValueType::kFloat32 ? "fp32" : type == ValueType::kFloat16 ? "fp16" : "bf16");
}

namespace {

struct StepCase {
  size_t numel;
  double density;
  bool nesterov;
  bool masking;
  bool clipping;
  SelectionMethod method;
};

class StepTest : public ::testing::TestWithParam<
                     std::tuple<size_t, double, bool, bool, bool, SelectionMethod>> {};

// Several steps of Compressor::step equal the reference step bit for bit: indices, values, u, v.
TEST_P(StepTest, EqualsReferenceStep) {
  const auto [n, density, nesterov, masking, clipping, method] = GetParam();
  CompressionOptions options;
  options.momentum.nesterov = nesterov;
  options.momentum.masking = masking;
  options.selection.method = method;
  options.seed = 17;
  // Two tensors, so the rng is shared across tensors as in training, and a joint clip norm.
  const size_t other = 3000;
  Compressor compressor({static_cast<int64_t>(n), static_cast<int64_t>(other)}, options);
  test::ReferenceState ref_a(n), ref_b(other);
  std::mt19937_64 ref_rng(17);
  Selection got;
  for (uint64_t step = 0; step < 4; ++step) {
    std::vector<float> ga = test::normal_values(n, 1000 * step + n, 0.1f);
    std::vector<float> gb = test::normal_values(other, 1000 * step + 7, 0.1f);
    if (clipping) {
      const double c = clip_coefficient(squared_norm(ga) + squared_norm(gb), 0.25);
      scale(ga, static_cast<float>(c));
      scale(gb, static_cast<float>(c));
    }
    compressor.step(0, ga, density, got);
    const Selection want_a = test::reference_step(ref_a, ga, density, options, ref_rng);
    ASSERT_EQ(got.indices, want_a.indices) << "step " << step;
    ASSERT_EQ(got.values, want_a.values) << "step " << step;
    compressor.step(1, gb, density, got);
    const Selection want_b = test::reference_step(ref_b, gb, density, options, ref_rng);
    ASSERT_EQ(got.indices, want_b.indices) << "step " << step;
    ASSERT_EQ(got.values, want_b.values) << "step " << step;
  }
  const auto u = compressor.momentum(0), v = compressor.velocity(0);
  EXPECT_TRUE(std::equal(u.begin(), u.end(), ref_a.u.begin(), ref_a.u.end()));
  EXPECT_TRUE(std::equal(v.begin(), v.end(), ref_a.v.begin(), ref_a.v.end()));
  const auto ub = compressor.momentum(1), vb = compressor.velocity(1);
  EXPECT_TRUE(std::equal(ub.begin(), ub.end(), ref_b.u.begin(), ref_b.u.end()));
  EXPECT_TRUE(std::equal(vb.begin(), vb.end(), ref_b.v.begin(), ref_b.v.end()));
}

INSTANTIATE_TEST_SUITE_P(Sampled, StepTest,
                         ::testing::Combine(::testing::Values(1, 2, 10, 1000, 65539),
                                            ::testing::Values(1.0, 0.25, 0.01, 0.001, 1e-4),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(SelectionMethod::kSampled)));
INSTANTIATE_TEST_SUITE_P(Exact, StepTest,
                         ::testing::Combine(::testing::Values(1, 1000, 65539),
                                            ::testing::Values(1.0, 0.01, 1e-4), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Values(false),
                                            ::testing::Values(SelectionMethod::kExact)));
INSTANTIATE_TEST_SUITE_P(
    Large, StepTest,
    ::testing::Combine(::testing::Values(1000000), ::testing::Values(0.01, 0.001, 1e-4),
                       ::testing::Bool(), ::testing::Values(true), ::testing::Values(false),
                       ::testing::Values(SelectionMethod::kSampled, SelectionMethod::kExact)));

// Applies w -= lr * update, the update scattered from the selection (one worker: no averaging).
void apply(std::vector<float>& w, const Selection& s, float lr) {
  std::vector<float> update(w.size(), 0.0f);
  for (size_t j = 0; j < s.indices.size(); ++j) update[s.indices[j]] = s.values[j];
  for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * update[i];
}

TEST(DensityOne, ReproducesMomentumSgdBitForBit) {
  const size_t n = 5000;
  const float lr = 0.05f, m = 0.9f;
  for (bool nesterov : {false, true}) {
    CompressionOptions options;
    options.momentum.nesterov = nesterov;
    options.momentum.masking = false;  // masking at density 1 would reset the momentum
    Compressor compressor({static_cast<int64_t>(n)}, options);
    std::vector<float> w = test::normal_values(n, 1), w_sgd = w, buf(n, 0.0f);
    Selection s;
    for (uint64_t step = 0; step < 6; ++step) {
      const std::vector<float> g = test::normal_values(n, 50 + step);
      compressor.step(0, g, 1.0, s);
      apply(w, s, lr);
      // Momentum SGD written by hand; Nesterov in the form u = m*(u + g), d = u + g.
      for (size_t i = 0; i < n; ++i) {
        float d;
        if (nesterov) {
          buf[i] = m * (buf[i] + g[i]);
          d = buf[i] + g[i];
        } else {
          buf[i] = m * buf[i] + g[i];
          d = buf[i];
        }
        w_sgd[i] -= lr * d;
      }
    }
    EXPECT_EQ(w, w_sgd) << (nesterov ? "nesterov" : "plain");
    const auto v = compressor.velocity(0);
    for (float x : v) ASSERT_EQ(x, 0.0f);  // everything was sent
  }
}

TEST(DensityOne, NesterovMatchesPyTorchFormWithinRounding) {
  // PyTorch: buf = m*buf + g; d = g + m*buf. Equal to DGC's u = m*(u+g); d = u + g up to rounding.
  const size_t n = 2000;
  const float lr = 0.05f, m = 0.9f;
  CompressionOptions options;
  options.momentum.nesterov = true;
  options.momentum.masking = false;
  Compressor compressor({static_cast<int64_t>(n)}, options);
  std::vector<float> w = test::normal_values(n, 2), w_torch = w, buf(n, 0.0f);
  Selection s;
  for (uint64_t step = 0; step < 10; ++step) {
    const std::vector<float> g = test::normal_values(n, 70 + step);
    compressor.step(0, g, 1.0, s);
    apply(w, s, lr);
    for (size_t i = 0; i < n; ++i) {
      buf[i] = m * buf[i] + g[i];
      w_torch[i] -= lr * (g[i] + m * buf[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(w[i], w_torch[i], 1e-5f * (1.0f + std::fabs(w[i])));
}

TEST(DensityOne, WithMaskingIsPlainSgd) {
  // Masking zeroes u wherever v was sent; at density 1 that is everywhere, every step.
  const size_t n = 1000;
  Compressor compressor({static_cast<int64_t>(n)}, CompressionOptions{});
  std::vector<float> w = test::normal_values(n, 3), w_sgd = w;
  Selection s;
  for (uint64_t step = 0; step < 4; ++step) {
    const std::vector<float> g = test::normal_values(n, 90 + step);
    compressor.step(0, g, 1.0, s);
    apply(w, s, 0.1f);
    for (size_t i = 0; i < n; ++i) w_sgd[i] -= 0.1f * g[i];
  }
  EXPECT_EQ(w, w_sgd);
}

class NothingLostTest : public ::testing::TestWithParam<ValueType> {};

// Over many steps: (everything sent) + (residual v) == (everything accumulated into v).
// Without masking u is observable after the step, and each step adds exactly u to v (plain).
TEST_P(NothingLostTest, SentPlusResidualEqualsAccumulatedVelocity) {
  const size_t n = 20000;
  CompressionOptions options;
  const double density = 0.01;
  options.value_type = GetParam();
  options.momentum.masking = false;
  Compressor compressor({static_cast<int64_t>(n)}, options);
  std::vector<double> sent(n, 0.0), accumulated(n, 0.0);
  Selection s;
  size_t sent_count = 0;
  for (uint64_t step = 0; step < 30; ++step) {
    // Some large values so that fp16 saturates now and then.
    std::vector<float> g = test::normal_values(n, 300 + step);
    g[step * 7] = 2e4f;
    compressor.step(0, g, density, s);
    const auto u = compressor.momentum(0);
    for (size_t i = 0; i < n; ++i) accumulated[i] += u[i];
    for (size_t j = 0; j < s.indices.size(); ++j) {
      EXPECT_EQ(round_to(s.values[j], options.value_type), s.values[j]) << "representable";
      sent[s.indices[j]] += s.values[j];
    }
    sent_count += s.indices.size();
  }
  ASSERT_GT(sent_count, 30 * 150u);
  const auto v = compressor.velocity(0);
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double error = std::fabs(sent[i] + v[i] - accumulated[i]);
    worst = std::max(worst, error / (1.0 + std::fabs(accumulated[i])));
  }
  EXPECT_LT(worst, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(ValueTypes, NothingLostTest,
                         ::testing::Values(ValueType::kFloat32, ValueType::kFloat16,
                                           ValueType::kBFloat16));

// What the exchange did not apply goes back into v: after returning the unapplied part of a
// selection, v equals the velocity before masking everywhere (selected = applied + returned).
TEST(Step, ReturnToVelocityRestoresTheUnappliedPart) {
  const size_t n = 5000;
  CompressionOptions options;
  const double density = 0.02;
  Compressor compressor({static_cast<int64_t>(n)}, options);
  Selection s;
  compressor.step(0, test::normal_values(n, 11), density, s);
  const std::vector<float> masked(compressor.velocity(0).begin(), compressor.velocity(0).end());
  ASSERT_GT(s.indices.size(), 10u);
  Selection unapplied;  // every other selected element was not applied
  for (size_t j = 0; j < s.indices.size(); j += 2) {
    unapplied.indices.push_back(s.indices[j]);
    unapplied.values.push_back(s.values[j]);
  }
  compressor.return_to_velocity(0, unapplied);
  const auto v = compressor.velocity(0);
  for (size_t j = 0; j < s.indices.size(); ++j) {
    EXPECT_EQ(v[s.indices[j]], j % 2 == 0 ? s.values[j] : 0.0f) << j;  // masking left 0 there
  }
  size_t changed = 0;
  for (size_t i = 0; i < n; ++i) changed += v[i] != masked[i];
  EXPECT_EQ(changed, unapplied.indices.size());
  Selection bad;
  bad.indices = {static_cast<uint32_t>(n)};
  bad.values = {1.0f};
  EXPECT_THROW(compressor.return_to_velocity(0, bad), InvalidArgument);
  EXPECT_THROW(compressor.return_to_velocity(1, unapplied), InvalidArgument);
}

TEST(Step, SixteenBitResidualKeepsTheRoundingError) {
  CompressionOptions options;
  options.value_type = ValueType::kFloat16;
  options.momentum.factor = 0.0;
  Compressor compressor({3}, options);
  const std::vector<float> g = {1.0f + 1.0f / 4096.0f, 1e5f, -3.0f};  // rounds; saturates; exact
  Selection s;
  compressor.step(0, g, 1.0, s);
  ASSERT_EQ(s.indices, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(s.values[0], 1.0f);  // 1 + 2^-12 rounds to 1 in fp16 (ulp 2^-10), tie to even
  EXPECT_EQ(s.values[1], 65504.0f);
  EXPECT_EQ(s.values[2], -3.0f);
  const auto v = compressor.velocity(0);
  EXPECT_EQ(v[0], 1.0f / 4096.0f);
  EXPECT_EQ(v[1], 1e5f - 65504.0f);
  EXPECT_EQ(v[2], 0.0f);
}

TEST(Step, ResultsDoNotDependOnThreads) {
  const size_t n = 100003;
  for (SelectionMethod method : {SelectionMethod::kSampled, SelectionMethod::kExact}) {
    std::vector<std::vector<uint32_t>> indices;
    std::vector<std::vector<float>> velocities;
    for (int threads : {1, 2, 3, 8}) {
      CompressionOptions options;
      options.threads = threads;
      options.min_numel_per_thread = 1000;
      options.selection.method = method;
      Compressor compressor({static_cast<int64_t>(n), 5000}, options);
      std::vector<uint32_t> all;
      Selection s;
      for (uint64_t step = 0; step < 5; ++step) {
        compressor.step(0, test::normal_values(n, 500 + step), 0.001, s);
        all.insert(all.end(), s.indices.begin(), s.indices.end());
        compressor.step(1, test::normal_values(5000, 600 + step), 0.01, s);
        all.insert(all.end(), s.indices.begin(), s.indices.end());
      }
      indices.push_back(all);
      const auto v = compressor.velocity(0);
      velocities.emplace_back(v.begin(), v.end());
    }
    for (size_t i = 1; i < indices.size(); ++i) {
      EXPECT_EQ(indices[i], indices[0]);
      EXPECT_EQ(velocities[i], velocities[0]);
    }
  }
}

TEST(Step, NonFiniteGradientThrowsAndLeavesFiniteState) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (SelectionMethod method : {SelectionMethod::kSampled, SelectionMethod::kExact}) {
      for (int threads : {1, 3}) {
        CompressionOptions options;
        options.selection.method = method;
        options.threads = threads;
        options.min_numel_per_thread = 1000;
        Compressor compressor({10000, 100}, options);
        Selection s;
        compressor.step(1, test::normal_values(100, 1), 0.1, s);
        std::vector<float> g = test::normal_values(10000, 2);
        g[4321] = bad;
        try {
          compressor.step(0, g, 0.01, s);
          FAIL() << "no NumericError";
        } catch (const NumericError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("tensor 0"), std::string::npos) << what;
          EXPECT_NE(what.find("4321"), std::string::npos) << what;
        }
        const auto u = compressor.momentum(0), v = compressor.velocity(0);
        for (size_t i = 0; i < u.size(); ++i) {
          ASSERT_TRUE(std::isfinite(u[i]) && std::isfinite(v[i])) << i;
        }
        EXPECT_EQ(u[4321], 0.0f);
        EXPECT_EQ(v[4321], 0.0f);
        // The next good step works.
        compressor.step(0, test::normal_values(10000, 3), 0.01, s);
        EXPECT_FALSE(s.indices.empty());
      }
    }
  }
}

TEST(Step, CheckpointRestoreContinuesIdentically) {
  CompressionOptions options;
  options.seed = 99;
  Compressor a({50000}, options);
  Selection s;
  for (uint64_t step = 0; step < 3; ++step) a.step(0, test::normal_values(50000, step), 0.01, s);
  // Save u, v and the rng as text; restore into a fresh Compressor.
  std::stringstream rng_text;
  rng_text << a.rng();
  Compressor b({50000}, options);
  std::copy(a.momentum(0).begin(), a.momentum(0).end(), b.momentum(0).begin());
  std::copy(a.velocity(0).begin(), a.velocity(0).end(), b.velocity(0).begin());
  rng_text >> b.rng();
  Compressor c = a;  // copies carry the state too
  Selection sa, sb, sc;
  for (uint64_t step = 3; step < 6; ++step) {
    const std::vector<float> g = test::normal_values(50000, step);
    a.step(0, g, 0.01, sa);
    b.step(0, g, 0.01, sb);
    c.step(0, g, 0.01, sc);
    EXPECT_EQ(sa.indices, sb.indices);
    EXPECT_EQ(sa.values, sb.values);
    EXPECT_EQ(sa.indices, sc.indices);
  }
}

TEST(Step, EmptyTensorAndArgumentChecks) {
  Compressor compressor({0, 10}, CompressionOptions{});
  Selection s;
  compressor.step(0, std::vector<float>{}, 0.001, s);
  EXPECT_TRUE(s.indices.empty());
  EXPECT_THROW(compressor.step(2, std::vector<float>(10), 0.1, s), InvalidArgument);
  EXPECT_THROW(compressor.step(1, std::vector<float>(9), 0.1, s), InvalidArgument);
  EXPECT_THROW(compressor.step(1, std::vector<float>(10), 0.0, s), InvalidArgument);
  EXPECT_THROW(compressor.step(1, std::vector<float>(10), 1.5, s), InvalidArgument);
  CompressionOptions bad;
  bad.threads = 0;
  EXPECT_THROW(Compressor({10}, bad), InvalidArgument);
  EXPECT_THROW(Compressor({-1}, CompressionOptions{}), InvalidArgument);
  EXPECT_THROW(Compressor({int64_t{1} << 33}, CompressionOptions{}), InvalidArgument);
}

TEST(RoundTo, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(round_to(0.1f, ValueType::kFloat32), 0.1f);
  // fp16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(round_to(1.0f + 1.0f / 2048.0f, ValueType::kFloat16), 1.0f);
  EXPECT_EQ(round_to(1.0f + 3.0f / 2048.0f, ValueType::kFloat16), 1.0f + 2.0f / 1024.0f);
  EXPECT_EQ(round_to(70000.0f, ValueType::kFloat16), 65504.0f);
  EXPECT_EQ(round_to(-70000.0f, ValueType::kFloat16), -65504.0f);
  EXPECT_EQ(round_to(65519.0f, ValueType::kFloat16), 65504.0f);
  // bf16: 8 bits of mantissa. 1 + 2^-8 is halfway: ties to even (1).
  EXPECT_EQ(round_to(1.0f + 1.0f / 256.0f, ValueType::kBFloat16), 1.0f);
  EXPECT_EQ(round_to(1.0f + 3.0f / 256.0f, ValueType::kBFloat16), 1.0f + 2.0f / 128.0f);
  EXPECT_EQ(round_to(std::numeric_limits<float>::max(), ValueType::kBFloat16),
            bf16_to_float(0x7F7F));
}

// Rounding with error feedback: over T calls the rounded values sum to the inputs' sum minus the
// last residual, every rounded value is representable in the type, and the residual stays below
// the rounding step of the value it came from.
class RoundWithResidual : public ::testing::TestWithParam<ValueType> {};

TEST_P(RoundWithResidual, SumOfSentIsSumOfInputsUpToTheLastResidual) {
  const ValueType type = GetParam();
  constexpr size_t kN = 257;
  constexpr int kSteps = 50;
  std::vector<float> residual(kN, 0.0f), values(kN);
  std::vector<double> inputs(kN, 0.0), sent(kN, 0.0);
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < kN; ++i) {
      values[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 1.9 * s) *
                                     std::pow(10.0, static_cast<double>(i % 7) - 3.0));
      inputs[i] += values[i];
    }
    round_with_residual(values, residual, type);
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(values[i], round_to(values[i], type)) << "not representable: " << i;
      sent[i] += values[i];
    }
  }
  double largest_residual = 0.0;
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(sent[i] + residual[i], inputs[i], 1e-5 * (1.0 + std::abs(inputs[i]))) << i;
    largest_residual = std::max(largest_residual, static_cast<double>(std::abs(residual[i])));
  }
  EXPECT_GT(largest_residual, 0.0);  // rounding did drop something, and it was fed back
}

INSTANTIATE_TEST_SUITE_P(Types, RoundWithResidual,
                         ::testing::Values(ValueType::kFloat16, ValueType::kBFloat16));

TEST(RoundWithResidual, Fp32LosesNothingAndSizesMustMatch) {
  std::vector<float> values = {1.5f, -2.25f}, residual = {0.25f, 0.0f};
  round_with_residual(values, residual, ValueType::kFloat32);
  EXPECT_EQ(values, (std::vector<float>{1.75f, -2.25f}));
  EXPECT_EQ(residual, (std::vector<float>{0.0f, 0.0f}));
  std::vector<float> short_residual(1);
  EXPECT_THROW(round_with_residual(values, short_residual, ValueType::kFloat16), InvalidArgument);
}

// stage() + commit() is step() bit for bit (selections, u, v, RNG), a discarded stage() leaves no
// trace, and a stage() that throws cannot be committed.
class StagedStep : public ::testing::TestWithParam<std::tuple<SelectionMethod, bool, int>> {};

TEST_P(StagedStep, CommitEqualsStepAndDiscardLeavesNoTrace) {
  const auto [method, nesterov, threads] = GetParam();
  CompressionOptions options;
  options.momentum.nesterov = nesterov;
  options.selection.method = method;
  options.threads = threads;
  options.min_numel_per_thread = 1000;
  options.seed = 5;
  const std::vector<int64_t> numels = {20011, 3000};
  Compressor in_place(numels, options), staged(numels, options);
  const auto state = [](Compressor& c) {
    std::vector<std::vector<float>> out;
    for (size_t t = 0; t < c.num_tensors(); ++t) {
      out.emplace_back(c.momentum(t).begin(), c.momentum(t).end());
      out.emplace_back(c.velocity(t).begin(), c.velocity(t).end());
    }
    std::ostringstream rng;
    rng << c.rng();
    return std::make_pair(out, rng.str());
  };
  Selection a, b;
  for (uint64_t step = 0; step < 5; ++step) {
    // A step that is thrown away: staged, then discarded.
    const auto before = state(staged);
    for (size_t t = 0; t < numels.size(); ++t) {
      staged.stage(t, test::normal_values(static_cast<size_t>(numels[t]), 900 + step + t, 5.0f),
                   0.01, b);
    }
    EXPECT_TRUE(staged.staged());
    EXPECT_EQ(state(staged), before) << "stage() changed the committed state";
    staged.discard();
    EXPECT_EQ(state(staged), before);
    // The step that is kept.
    for (size_t t = 0; t < numels.size(); ++t) {
      const auto g = test::normal_values(static_cast<size_t>(numels[t]), 100 * step + t, 0.1f);
      in_place.step(t, g, 0.01, a);
      staged.stage(t, g, 0.01, b);
      EXPECT_EQ(a.indices, b.indices) << "step " << step << " tensor " << t;
      EXPECT_EQ(a.values, b.values) << "step " << step << " tensor " << t;
    }
    staged.commit();
    EXPECT_FALSE(staged.staged());
    ASSERT_EQ(state(staged), state(in_place)) << "step " << step;
  }
  // A stage() that throws: commit() refuses, discard() keeps the state as it was.
  const auto before = state(staged);
  std::vector<float> bad = test::normal_values(3000, 1, 0.1f);
  bad[17] = std::numeric_limits<float>::quiet_NaN();
  staged.stage(0, test::normal_values(20011, 2, 0.1f), 0.01, b);
  EXPECT_THROW(staged.stage(1, bad, 0.01, b), NumericError);
  EXPECT_THROW(staged.commit(), InvalidArgument);
  EXPECT_THROW(staged.stage(0, test::normal_values(20011, 2, 0.1f), 0.01, b), InvalidArgument);
  staged.discard();
  EXPECT_EQ(state(staged), before);
}

INSTANTIATE_TEST_SUITE_P(Methods, StagedStep,
                         ::testing::Combine(::testing::Values(SelectionMethod::kSampled,
                                                              SelectionMethod::kExact),
                                            ::testing::Bool(), ::testing::Values(1, 3)));

TEST(RoundWithResidual, OutOfPlaceEqualsInPlace) {
  for (ValueType type : {ValueType::kFloat16, ValueType::kBFloat16}) {
    std::vector<float> values = test::normal_values(1000, 3, 1.0f);
    std::vector<float> residual = test::normal_values(1000, 4, 1e-3f);
    std::vector<float> values2 = values, residual2 = residual, next(1000);
    round_with_residual(values, residual, type);
    round_with_residual(values2, residual2, next, type);
    EXPECT_EQ(values2, values);
    EXPECT_EQ(next, residual);
    EXPECT_EQ(residual2, test::normal_values(1000, 4, 1e-3f)) << "the old residual was written";
  }
}

}  // namespace
}  // namespace dgc
