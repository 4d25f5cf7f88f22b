// `--resume auto` at another world size (resume.h): which old ranks each new rank inherits, where
// the run continues in the epoch, and the hand-over of the per-rank DGC state, which keeps the
// average residual and momentum over the ranks what they were.
#include "dgc/train/resume.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

TEST(ElasticResume, InheritedRanksCoverEveryOldRankOnce) {
  for (int old_world = 1; old_world <= 6; ++old_world) {
    for (int world = 1; world <= 6; ++world) {
      std::vector<int> seen(old_world, 0);
      for (int rank = 0; rank < world; ++rank) {
        const auto ranks = inherited_ranks(rank, world, old_world);
        if (rank < old_world) {
          ASSERT_FALSE(ranks.empty());
          EXPECT_EQ(ranks.front(), rank) << "a surviving rank keeps its own state first";
        } else {
          EXPECT_TRUE(ranks.empty()) << "a joining rank starts with zero state";
        }
        for (const int r : ranks) ++seen[r];
      }
      for (int r = 0; r < old_world; ++r) EXPECT_EQ(seen[r], 1) << old_world << " -> " << world;
    }
  }
}

TEST(ElasticResume, TheEpochAndItsConsumedExamplesStay) {
  // 3 workers, 22 iterations per epoch -> 2 workers, 32: after 1 epoch and 8 steps (8 x 3 global
  // batches of the epoch consumed) the 2 workers continue at step 12 of the epoch.
  EXPECT_EQ(rescaled_iteration(30, 1, 22, 3, 2, 32), 32 + 12);
  EXPECT_EQ(rescaled_iteration(22, 1, 22, 3, 2, 32), 32) << "an epoch's end stays one";
  EXPECT_EQ(rescaled_iteration(0, 0, 22, 3, 2, 32), 0);
  EXPECT_EQ(rescaled_iteration(21, 0, 22, 3, 2, 32), 31) << "never past the epoch's last step";
  EXPECT_EQ(rescaled_iteration(5, 0, 16, 2, 4, 8), 2) << "growing: floor(5 x 2 / 4)";
  EXPECT_THROW(rescaled_iteration(50, 1, 22, 3, 2, 32), InvalidArgument);
}

const std::string kSettings = "density=0.01\niterations_per_epoch=22\nwarmup_stage_iterations=6\n";
const std::string kNewSettings =
    "density=0.01\niterations_per_epoch=32\nwarmup_stage_iterations=8\n";

CheckpointFile old_file(int rank, int world, int64_t iteration, uint64_t seed) {
  CheckpointFile file;
  file.put_text("optimizer/settings", kSettings);
  file.put_text("optimizer/world_size", std::to_string(world));
  file.put_text("optimizer/rank", std::to_string(rank));
  file.put_text("optimizer/iteration", std::to_string(iteration));
  file.put_text("optimizer/bytes_total", bytes_text(ExchangeBytes{}));
  file.put_text("optimizer/bytes_post_warmup", bytes_text(ExchangeBytes{}));
  file.put_text("train/epochs_done", std::to_string(iteration / 22));
  file.put_text("train/epoch_loss_sum", double_text(1.5 * (rank + 1)));
  file.put_text("dgc/rng", "old rng of rank " + std::to_string(rank));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (const std::string name : {"dgc/velocity/w", "dgc/momentum/w", "optimizer/momentum/b"}) {
    std::vector<float> values(100);
    for (auto& v : values) v = name == "optimizer/momentum/b" ? 0.25f : normal(rng);
    file.put_floats(name, values);
  }
  return file;
}

std::vector<float> floats(const CheckpointFile& file, const std::string& name) {
  std::vector<float> values(file.get(name).data.size() / sizeof(float));
  file.get_floats(name, values);
  return values;
}

// The sum over ranks of a per-rank record, divided by the world size.
std::vector<double> average(const std::vector<CheckpointFile>& files, const std::string& name) {
  std::vector<double> sum(100, 0.0);
  for (const auto& file : files) {
    const auto values = floats(file, name);
    for (size_t e = 0; e < values.size(); ++e) sum[e] += values[e];
  }
  for (auto& s : sum) s /= static_cast<double>(files.size());
  return sum;
}

// 3 -> 2 (shrink) and 3 -> 4 (a rank joins): the average velocity and momentum over the ranks
// are what they were (to float rounding); shared state is kept; a joining rank has zero state,
// its own RNG and zero byte counters; the epoch's loss sum over ranks is kept.
TEST(ElasticResume, HandOverKeepsTheAverageResidualAndMomentum) {
  std::vector<CheckpointFile> old;
  for (int r = 0; r < 3; ++r) old.push_back(old_file(r, 3, 30, 100 + r));
  CheckpointFile fresh;
  fresh.put_text("optimizer/bytes_total", bytes_text(ExchangeBytes{}));
  fresh.put_text("optimizer/bytes_post_warmup", bytes_text(ExchangeBytes{}));
  fresh.put_text("dgc/rng", "fresh rng");
  for (const int world : {1, 2, 4}) {
    std::vector<CheckpointFile> rescaled;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<CheckpointFile> inherited;
      for (const int r : inherited_ranks(rank, world, 3)) inherited.push_back(old[r]);
      rescaled.push_back(
          rescale_checkpoint(inherited, old[0], fresh, rank, world, kNewSettings, 32));
      const auto& file = rescaled.back();
      EXPECT_EQ(file.text("optimizer/settings"), kNewSettings);
      EXPECT_EQ(read_int(file, "optimizer/world_size"), world);
      EXPECT_EQ(read_int(file, "optimizer/rank"), rank);
      EXPECT_EQ(read_int(file, "optimizer/iteration"), rescaled_iteration(30, 1, 22, 3, world, 32));
      EXPECT_EQ(floats(file, "optimizer/momentum/b"), std::vector<float>(100, 0.25f));
      EXPECT_EQ(file.text("dgc/rng"),
                rank < 3 ? "old rng of rank " + std::to_string(rank) : "fresh rng");
      if (rank >= 3) {
        EXPECT_EQ(floats(file, "dgc/velocity/w"), std::vector<float>(100, 0.0f));
        EXPECT_EQ(read_double(file, "train/epoch_loss_sum"), 0.0);
      }
    }
    for (const std::string name : {"dgc/velocity/w", "dgc/momentum/w"}) {
      const auto before = average(old, name);
      const auto after = average(rescaled, name);
      for (size_t e = 0; e < before.size(); ++e) {
        EXPECT_NEAR(after[e], before[e], 1e-6 * (1.0 + std::abs(before[e])))
            << name << " element " << e << ", 3 -> " << world << " ranks";
      }
    }
    double loss = 0.0;
    for (const auto& file : rescaled) loss += read_double(file, "train/epoch_loss_sum");
    EXPECT_EQ(loss, 1.5 + 3.0 + 4.5) << "3 -> " << world;
  }
}

TEST(ElasticResume, RefusesOtherSettingsAndInconsistentFiles) {
  std::vector<CheckpointFile> old;
  for (int r = 0; r < 3; ++r) old.push_back(old_file(r, 3, 30, 100 + r));
  const CheckpointFile fresh;
  try {
    rescale_checkpoint({old[0], old[2]}, old[0], fresh, 0, 2,
                       "density=0.001\niterations_per_epoch=32\nwarmup_stage_iterations=8\n", 32);
    ADD_FAILURE() << "another density was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("setting 'density' is 0.01 in the checkpoint but 0.001"),
              std::string::npos)
        << e.what();
  }
  auto other_step = old_file(2, 3, 40, 7);
  EXPECT_THROW(rescale_checkpoint({old[0], other_step}, old[0], fresh, 0, 2, kNewSettings, 32),
               DataError);
  EXPECT_THROW(rescale_checkpoint({old[0], old[1]}, old[0], fresh, 0, 2, kNewSettings, 32),
               DataError)
      << "rank 0 of 2 inherits old ranks 0 and 2, not 1";
}

}  // namespace
}  // namespace dgc::train
