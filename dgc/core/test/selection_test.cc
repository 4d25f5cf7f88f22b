// Threshold selection (selection.h) against the references in reference.h.
#include "dgc/core/selection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "dgc/core/error.h"
#include "dgc/core/kernels.h"
#include "dgc/core/test/reference.h"

namespace dgc {
namespace {

void expect_same(const Selection& got, const Selection& want, const char* what) {
  EXPECT_EQ(got.indices, want.indices) << what;
  EXPECT_EQ(got.values, want.values) << what;
  EXPECT_EQ(got.threshold, want.threshold) << what;
  EXPECT_EQ(got.rounds, want.rounds) << what;
  EXPECT_EQ(got.hierarchical, want.hierarchical) << what;
}

TEST(TargetCount, CeilOfDensityTimesNumel) {
  EXPECT_EQ(target_count(0, 0.5), 0u);
  EXPECT_EQ(target_count(10, 0.0), 0u);
  EXPECT_EQ(target_count(1, 0.001), 1u);
  EXPECT_EQ(target_count(1000, 0.001), 1u);
  EXPECT_EQ(target_count(1001, 0.001), 2u);
  EXPECT_EQ(target_count(30, 0.1), 3u);  // 0.1 * 30 = 3.0000000000000004 in binary
  EXPECT_EQ(target_count(25557032, 0.001), 25558u);
  EXPECT_EQ(target_count(10, 1.0), 10u);
  EXPECT_EQ(target_count(10, 1e-9), 1u);
}

TEST(SampleCount, OnePercentButAtLeastTwoOverDensity) {
  EXPECT_EQ(sample_count(0, 0.001, 0.01), 0u);
  EXPECT_EQ(sample_count(1000000, 0.001, 0.01), 10000u);
  EXPECT_EQ(sample_count(100000, 0.001, 0.01), 2000u);  // ceil(2/d) wins
  EXPECT_EQ(sample_count(1000, 0.001, 0.01), 1000u);    // never more than the tensor
  EXPECT_EQ(sample_count(25557032, 0.001, 0.01), 255571u);
  EXPECT_EQ(sample_count(100, 1.0, 0.01), 2u);
  EXPECT_THROW(sample_count(100, 0.0, 0.01), InvalidArgument);
}

TEST(SelectExact, KeepsTheLargestMagnitudesTiesByLowerIndex) {
  const std::vector<float> v = {0.1f, -5.0f, 0.2f, 3.0f, 0.0f, 4.0f};
  Selection s;
  select_exact(v, 3, s);
  EXPECT_EQ(s.indices, (std::vector<uint32_t>{1, 3, 5}));
  EXPECT_EQ(s.values, (std::vector<float>{-5.0f, 3.0f, 4.0f}));
  EXPECT_EQ(s.threshold, 3.0f);
  const std::vector<float> ties = {1.0f, -2.0f, 2.0f, 1.0f, -2.0f, 1.0f};
  select_exact(ties, 4, s);  // the three 2s, then the first 1
  EXPECT_EQ(s.indices, (std::vector<uint32_t>{0, 1, 2, 4}));
  select_exact(ties, 100, s);
  EXPECT_EQ(s.indices.size(), ties.size());
  select_exact(ties, 0, s);
  EXPECT_TRUE(s.indices.empty());
}

class SelectExactTest : public ::testing::TestWithParam<std::tuple<size_t, double, bool>> {};

TEST_P(SelectExactTest, EqualsFullSortAndSeparatesKeptFromDropped) {
  const auto [n, density, tied] = GetParam();
  const std::vector<float> v = tied ? test::tied_values(n, n) : test::normal_values(n, n);
  const size_t k = target_count(n, density);
  Selection got;
  select_exact(v, k, got);
  const Selection want = test::reference_exact(v, k);
  EXPECT_EQ(got.indices, want.indices);
  EXPECT_EQ(got.values, want.values);
  ASSERT_EQ(got.indices.size(), std::min(k, n));
  std::vector<bool> kept(n, false);
  float min_kept = std::numeric_limits<float>::infinity();
  for (uint32_t i : got.indices) {
    kept[i] = true;
    min_kept = std::min(min_kept, std::fabs(v[i]));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!kept[i]) {
      EXPECT_LE(std::fabs(v[i]), min_kept) << i;
    }
  }
  if (!got.indices.empty()) {
    EXPECT_EQ(got.threshold, min_kept);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SelectExactTest,
                         ::testing::Combine(::testing::Values(1, 7, 1000, 65537),
                                            ::testing::Values(1.0, 0.1, 0.001), ::testing::Bool()));

TEST(SelectExact, NaNThrowsNumericError) {
  std::vector<float> v = test::normal_values(100, 1);
  v[42] = std::numeric_limits<float>::quiet_NaN();
  Selection s;
  EXPECT_THROW(select_exact(v, 5, s), NumericError);
}

class SelectSampledTest : public ::testing::TestWithParam<std::tuple<size_t, double, bool>> {};

TEST_P(SelectSampledTest, EqualsReferenceWithTheSameThresholdLogic) {
  const auto [n, density, tied] = GetParam();
  const std::vector<float> v = tied ? test::tied_values(n, n + 1) : test::normal_values(n, n + 1);
  const size_t k = target_count(n, density);
  SelectionOptions options;
  for (uint64_t seed : {1, 2, 3}) {
    std::mt19937_64 rng(seed), ref_rng(seed);
    Selection got;
    select_sampled(v, k, density, options, rng, got);
    const Selection want = test::reference_sampled(v, k, density, options, ref_rng);
    expect_same(got, want, "sampled");
    EXPECT_EQ(rng(), ref_rng()) << "the same number of draws";
    EXPECT_TRUE(std::is_sorted(got.indices.begin(), got.indices.end()));
    EXPECT_TRUE(std::adjacent_find(got.indices.begin(), got.indices.end()) == got.indices.end());
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SelectSampledTest,
                         ::testing::Combine(::testing::Values(1, 2, 5, 100, 1000, 4097, 100003),
                                            ::testing::Values(1.0, 0.5, 0.1, 0.01, 0.001, 1e-4),
                                            ::testing::Bool()));

TEST(SelectSampled, CountWithinTheAcceptanceBandOrExactlyK) {
  SelectionOptions options;
  int hierarchical = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (double density : {0.01, 0.001}) {
      const std::vector<float> v = test::normal_values(200000, 1000 + seed);
      const size_t k = target_count(v.size(), density);
      std::mt19937_64 rng(seed);
      Selection s;
      select_sampled(v, k, density, options, rng, s);
      if (s.hierarchical) {
        ++hierarchical;
        EXPECT_EQ(s.indices.size(), k);
      } else {
        EXPECT_GE(static_cast<double>(s.indices.size()), 0.8 * static_cast<double>(k));
        EXPECT_LE(static_cast<double>(s.indices.size()), 1.3 * static_cast<double>(k));
      }
      // Everything kept is at least the threshold; everything dropped is below it (or tied
      // and cut by the hierarchical step).
      std::vector<bool> kept(v.size(), false);
      for (uint32_t i : s.indices) {
        kept[i] = true;
        EXPECT_GE(std::fabs(v[i]), s.threshold);
      }
      for (size_t i = 0; i < v.size(); ++i) {
        if (!kept[i]) {
          EXPECT_LE(std::fabs(v[i]), s.threshold);
        }
      }
    }
  }
  RecordProperty("hierarchical_runs", hierarchical);
  EXPECT_GT(hierarchical, 0) << "both outcomes should occur over 40 runs";
  EXPECT_LT(hierarchical, 40);
}

TEST(SelectSampled, HierarchicalKeepsLargestNotFirstPositions) {
  // Ties everywhere except ten large values near the END, placed off the sample positions: the
  // sampled threshold admits every element and the exact top-k among them must keep the large
  // ones. Truncating by position would keep indices 0..9.
  const size_t n = 10000;
  const double density = 0.001;
  const SelectionOptions options;
  std::mt19937_64 probe(7);
  const test::SamplePositions p = test::reference_sample_positions(n, density, options, probe);
  ASSERT_GT(p.stride, 1u);
  std::vector<float> v(n, 1.0f);
  std::vector<uint32_t> large;
  for (size_t i = n - 1; large.size() < 10; --i) {
    if (i % p.stride != p.start % p.stride) {
      v[i] = 100.0f + static_cast<float>(i);
      large.insert(large.begin(), static_cast<uint32_t>(i));
    }
  }
  std::mt19937_64 rng(7);
  Selection s;
  select_sampled(v, 10, density, options, rng, s);
  EXPECT_TRUE(s.hierarchical);
  EXPECT_EQ(s.indices, large);
}

TEST(SelectSampled, ThresholdDecaysWhenTooFewPass) {
  // Large values exactly at the first sample positions set a threshold that too few elements
  // pass; the threshold decays by 0.8 per round until enough pass (or max_rounds).
  const size_t n = 100000;
  const double density = 0.01;  // k = 1000, 1000 samples at stride 100, threshold = 10th largest
  const SelectionOptions options;
  for (float rest_scale : {0.5f, 0.001f}) {
    std::mt19937_64 probe(3);
    const test::SamplePositions p = test::reference_sample_positions(n, density, options, probe);
    std::vector<float> v = test::normal_values(n, 4, rest_scale);
    for (size_t i = 0; i < 10; ++i) v[p.start + i * p.stride] = 2.0f;
    std::mt19937_64 rng(3), ref_rng(3);
    Selection s;
    select_sampled(v, 1000, density, options, rng, s);
    const Selection want = test::reference_sampled(v, 1000, density, options, ref_rng);
    expect_same(s, want, "decay");
    if (rest_scale == 0.5f) {
      EXPECT_GT(s.rounds, 0);
      EXPECT_LT(s.rounds, options.max_rounds);
      EXPECT_GE(s.indices.size(), 800u);
    } else {
      EXPECT_EQ(s.rounds, options.max_rounds);  // nothing else comes near: gives up, keeps 10
      EXPECT_EQ(s.indices.size(), 10u);
    }
  }
}

TEST(SelectSampled, ZerosAreNeverSelected) {
  std::vector<float> v(1000, 0.0f);
  v[3] = 1.0f;
  v[500] = -2.0f;
  std::mt19937_64 rng(1);
  Selection s;
  select_sampled(v, 100, 0.1, SelectionOptions{}, rng, s);
  EXPECT_EQ(s.indices, (std::vector<uint32_t>{3, 500}));
  select_sampled(v, 1000, 1.0, SelectionOptions{}, rng, s);
  EXPECT_EQ(s.indices, (std::vector<uint32_t>{3, 500}));
  const std::vector<float> zeros(100, 0.0f);
  select_sampled(zeros, 10, 0.1, SelectionOptions{}, rng, s);
  EXPECT_TRUE(s.indices.empty());
}

TEST(SelectSampled, ResultDoesNotDependOnThreads) {
  const std::vector<float> v = test::normal_values(300007, 5);
  for (double density : {0.1, 0.001}) {
    Selection first;
    for (int threads : {1, 2, 3, 8}) {
      std::mt19937_64 rng(11);
      Selection s;
      select_sampled(v, target_count(v.size(), density), density, SelectionOptions{}, rng, s,
                     threads);
      if (threads == 1) {
        first = s;
      } else {
        expect_same(s, first, "threads");
      }
    }
  }
}

TEST(SelectSampled, NonFiniteVelocityThrowsNumericError) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> v = test::normal_values(50000, 9);
    v[31337] = bad;
    std::mt19937_64 rng(1);
    Selection s;
    EXPECT_THROW(select_sampled(v, 50, 0.001, SelectionOptions{}, rng, s), NumericError);
    EXPECT_THROW(select_sampled(v, 50, 0.001, SelectionOptions{}, rng, s, 4), NumericError);
  }
}

TEST(SelectSampled, RejectsBadOptions) {
  const std::vector<float> v(10, 1.0f);
  std::mt19937_64 rng(1);
  Selection s;
  SelectionOptions bad;
  bad.threshold_decay = 1.0;
  EXPECT_THROW(select_sampled(v, 1, 0.1, bad, rng, s), InvalidArgument);
  EXPECT_THROW(select_sampled(v, 1, 0.0, SelectionOptions{}, rng, s), InvalidArgument);
  EXPECT_THROW(select_sampled(v, 1, 0.1, SelectionOptions{}, rng, s, 0), InvalidArgument);
}

// The fused path (momentum update, in-pass sample, candidates gathered at a predicted threshold)
// must give the reference's selection whether the prediction is below the sampled threshold
// (candidates filtered), above it (a read-only pass), absent, or too low (candidate cap hit).
TEST(FusedSelect, PredictionNeverChangesTheResult) {
  const size_t n = 200003;
  const double density = 0.001;
  const size_t k = target_count(n, density);
  const std::vector<float> g = test::normal_values(n, 21);
  for (bool nesterov : {false, true}) {
    MomentumOptions mo;
    mo.nesterov = nesterov;
    // First the reference: the updated velocity and its sampled selection.
    std::vector<float> ref_u = test::normal_values(n, 22), ref_v = test::normal_values(n, 23);
    const std::vector<float> u0 = ref_u, v0 = ref_v;
    test::reference_accumulate(ref_u, ref_v, g, mo);
    std::mt19937_64 ref_rng(5);
    const Selection want = test::reference_sampled(ref_v, k, density, SelectionOptions{}, ref_rng);
    std::mt19937_64 probe(5);
    const float sampled =
        test::reference_sampled_threshold(ref_v, density, SelectionOptions{}, probe);
    const float predictions[] = {0.0f,
                                 sampled,
                                 sampled * 0.99f,
                                 sampled * 1.01f,
                                 sampled * 0.05f,
                                 std::numeric_limits<float>::infinity()};
    for (float predicted : predictions) {
      for (size_t parts : {1, 3}) {
        std::vector<float> u = u0, v = v0;
        detail::PassTarget target;
        target.velocity = v.data();
        target.size = n;
        target.update = nesterov ? detail::Update::kNesterov : detail::Update::kPlain;
        target.momentum = u.data();
        target.grad = g.data();
        target.m = 0.9f;
        detail::ThresholdHistory history;
        if (predicted > 0.0f && std::isfinite(predicted)) {
          history.last = predicted;
          history.previous = predicted;
          history.gap = 0.0f;
          ASSERT_EQ(history.predict(), predicted);
        }
        detail::PassScratch scratch;
        std::mt19937_64 rng(5);
        Selection got;
        detail::sampled_select(target, k, density, SelectionOptions{}, rng, got, parts, nullptr,
                               scratch, true, &history);
        expect_same(got, want, "fused");
        EXPECT_EQ(u, ref_u);
        EXPECT_EQ(v, ref_v);
        EXPECT_EQ(history.last, sampled);
      }
    }
  }
}

}  // namespace
}  // namespace dgc
