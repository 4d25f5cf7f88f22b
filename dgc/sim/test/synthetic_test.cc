// The simulated cluster's synthetic selections (synthetic.h): k distinct sorted indices per
// tensor, and the stated overlap across ranks kept over a whole model, small tensors included.
#include "dgc/sim/synthetic.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/core/selection.h"
#include "dgc/train/model_shapes.h"

namespace dgc::sim {
namespace {

std::vector<uint64_t> numels_of(const std::string& model) {
  std::vector<uint64_t> numels;
  for (const auto& [name, shape] : train::model_shapes(model)) {
    uint64_t n = 1;
    for (const int64_t s : shape) n *= static_cast<uint64_t>(s);
    numels.push_back(n);
  }
  return numels;
}

// The share of rank a's indices, over every tensor, that rank b selects too.
double model_overlap(const std::vector<uint64_t>& numels, int a, int b,
                     const SyntheticOptions& options) {
  double shared = 0.0, selected = 0.0;
  for (size_t t = 0; t < numels.size(); ++t) {
    const auto mine = synthetic_indices(numels[t], t, a, options);
    const auto theirs = synthetic_indices(numels[t], t, b, options);
    shared += shared_fraction(mine, theirs) * double(mine.size());
    selected += double(mine.size());
  }
  return shared / selected;
}

TEST(SyntheticIndices, KDistinctSortedIndicesInRange) {
  const SyntheticOptions options{.density = 0.001, .overlap = 0.3, .seed = 7};
  const auto numels = numels_of("resnet50");
  for (size_t t = 0; t < numels.size(); ++t) {
    const auto indices = synthetic_indices(numels[t], t, 3, options);
    ASSERT_EQ(indices.size(), target_count(numels[t], options.density)) << "tensor " << t;
    EXPECT_TRUE(std::is_sorted(indices.begin(), indices.end()));
    EXPECT_EQ(std::adjacent_find(indices.begin(), indices.end()), indices.end());
    EXPECT_LT(indices.back(), numels[t]);
  }
}

// A tensor with k = 10 at overlap 0.03: rounding 0.3 shared indices to the nearest integer gave
// none, for every seed. Rounded at random, 0.3 of them on average over the seeds.
TEST(SyntheticIndices, SmallTensorsKeepTheOverlapOnAverage) {
  double shared = 0.0;
  constexpr int kSeeds = 400;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    const SyntheticOptions options{
        .density = 0.001, .overlap = 0.03, .seed = static_cast<uint64_t>(seed)};
    const auto mine = synthetic_indices(10000, 4, 0, options);
    ASSERT_EQ(mine.size(), 10u);
    shared += shared_fraction(mine, synthetic_indices(10000, 4, 1, options)) * 10.0;
  }
  // Binomial: 0.3 +- 0.023 (one standard error); chance meetings add 0.01.
  EXPECT_NEAR(shared / kSeeds, 0.31, 0.08);
}

// Over ResNet-50 (161 tensors, 115 of them with k below 33) the share of rank 0's indices that
// another rank holds is the stated overlap, and the same for every pair of ranks.
TEST(SyntheticIndices, ModelKeepsTheOverlap) {
  const auto numels = numels_of("resnet50");
  for (const double overlap : {0.03, 0.1, 0.5}) {
    const SyntheticOptions options{.density = 0.001, .overlap = overlap, .seed = 1};
    const double measured = model_overlap(numels, 0, 1, options);
    EXPECT_NEAR(measured, overlap, 0.01) << "overlap " << overlap;
    EXPECT_NEAR(model_overlap(numels, 2, 5, options), measured, 0.005) << "overlap " << overlap;
  }
  const SyntheticOptions none{.density = 0.001, .overlap = 0.0, .seed = 1};
  EXPECT_LT(model_overlap(numels, 0, 1, none), 0.005);
  const SyntheticOptions all{.density = 0.001, .overlap = 1.0, .seed = 1};
  EXPECT_EQ(model_overlap(numels, 0, 1, all), 1.0);
}

TEST(SyntheticIndices, RejectsAnOverlapOutsideZeroToOne) {
  const SyntheticOptions options{.density = 0.001, .overlap = 1.5, .seed = 1};
  EXPECT_ANY_THROW(synthetic_indices(1000, 0, 0, options));
}

}  // namespace
}  // namespace dgc::sim
