// A non-finite gradient on one rank under each policy (OptimizerOptions::on_nonfinite), on 1, 2
// and 4 ranks (threads as ranks, Gloo over loopback), through DistributedStep, the code both the
// C++ optimizer and the Python hook run.
//
// "Equals" below means bit for bit (std::vector<float> ==, the RNG's text): the state of a rank
// is every buffer of DistributedStep::state_buffers() (u and v of every compressor tensor, the
// weight-decay and dense momenta, the rounding residual), its rng_state() and the weights the
// test applies the directions to. The schedules run on the iteration counter, which a skipped
// step advances (the bad batch is consumed): so "a run that never saw the bad step" is the same
// run with the bad step left out and the counter moved past it (set_iteration), which gives every
// later step the density and learning rate of its own iteration.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/train/options.h"
#include "dgc/train/step.h"

namespace dgc::train {
namespace {

comm::GlooOptions gloo_options() {
  comm::GlooOptions options;
  options.timeout = std::chrono::seconds(30);
  return options;
}

const std::vector<std::pair<std::string, std::vector<int64_t>>> kShapes = {
    {"fc.weight", {48, 40}}, {"fc.bias", {48}}, {"out.weight", {10, 48}}, {"out.bias", {10}}};

OptimizerOptions make_options(NonFinitePolicy policy, DensePath dense_path) {
  OptimizerOptions o;
  o.on_nonfinite = policy;
  o.dense_path = dense_path;
  o.density = {.after_warmup = 0.02, .warmup_epochs = 1.0, .iterations_per_stage = 1};
  o.iterations_per_epoch = 3;  // density warm-up over iterations 0-2: the schedule moves
  o.policy.min_numel = 256;
  o.weight_decay = 1e-3;
  o.clip_norm = 2.0;
  o.compressor.seed = 3;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Rank- and step-distinct gradients with a closed-form seed.
std::vector<std::vector<float>> gradients(int rank, int step) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + rank + 1));
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<std::vector<float>> out;
  for (const auto& [name, shape] : kShapes) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    std::vector<float> g(static_cast<size_t>(n));
    for (float& x : g) x = normal(rng);
    out.push_back(std::move(g));
  }
  return out;
}

// One rank's model: weights, and the step applied at lr 0.1 (w -= lr * direction).
struct Rank {
  Rank(comm::Communicator& comm, const OptimizerOptions& options) : step(comm, kShapes, options) {
    for (size_t t = 0; t < kShapes.size(); ++t) {
      const auto n = static_cast<size_t>(step.layout()[t].numel());
      weights.emplace_back(n, 0.01f * static_cast<float>(t + 1));
      directions.emplace_back(n, 0.0f);
    }
  }
  // Runs a step with these gradients; applies the directions when it was taken.
  bool run(std::vector<std::vector<float>> grads) {
    std::vector<std::span<float>> g, d;
    std::vector<std::span<const float>> w;
    for (size_t t = 0; t < grads.size(); ++t) {
      g.emplace_back(grads[t]);
      d.emplace_back(directions[t]);
      w.emplace_back(weights[t]);
    }
    const bool taken = step.run(g, w, d);
    if (taken) {
      for (size_t t = 0; t < weights.size(); ++t) {
        for (size_t e = 0; e < weights[t].size(); ++e) weights[t][e] -= 0.1f * directions[t][e];
      }
    }
    return taken;
  }
  // The whole state, for bit-for-bit comparisons.
  std::map<std::string, std::vector<float>> state() const {
    std::map<std::string, std::vector<float>> out;
    for (const auto& b : step.state_buffers()) out[b.name].assign(b.values.begin(), b.values.end());
    for (size_t t = 0; t < weights.size(); ++t) out["weights/" + std::to_string(t)] = weights[t];
    return out;
  }
  DistributedStep step;
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> directions;
};

std::vector<std::vector<float>> bad_gradients(int rank, int step, float bad) {
  auto g = gradients(rank, step);
  g[0][17] = bad;
  return g;
}

struct Case {
  int world;
  NonFinitePolicy policy;
  DensePath dense_path;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << to_string(c.policy) << ", " << c.world << " ranks, dense path " << to_string(c.dense_path);
}

class NonFinitePolicyTest : public ::testing::TestWithParam<Case> {};

TEST_P(NonFinitePolicyTest, NothingOfTheBadStepIsAppliedOnAnyRank) {
  const auto [world, policy, dense_path] = GetParam();
  const auto options = make_options(policy, dense_path);
  constexpr int kBad = 2;  // the bad step; steps 0, 1 and 3 are good
  const int bad_rank = world - 1;
  const bool skip = policy == NonFinitePolicy::kSkip;

  // The run that never saw the bad step: steps 0 and 1, the counter moved past step 2, step 3.
  std::vector<std::map<std::string, std::vector<float>>> reference(world);
  std::vector<std::string> reference_rng(world);
  std::vector<std::vector<std::vector<float>>> reference_directions(world);
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    Rank r(comm, options);
    const int rank = comm.rank();
    ASSERT_TRUE(r.run(gradients(rank, 0)));
    ASSERT_TRUE(r.run(gradients(rank, 1)));
    r.step.set_iteration(skip ? kBad + 1 : kBad);
    ASSERT_TRUE(r.run(gradients(rank, kBad + 1)));
    reference[rank] = r.state();
    reference_rng[rank] = r.step.rng_state();
    reference_directions[rank] = r.directions;
  });

  std::mutex mutex;
  std::vector<std::string> messages;
  std::atomic<int> skipped{0};
  comm::run_local(world, gloo_options(), [&](comm::Communicator& comm) {
    Rank r(comm, options);
    const int rank = comm.rank();
    ASSERT_TRUE(r.run(gradients(rank, 0)));
    ASSERT_TRUE(r.run(gradients(rank, 1)));
    const auto before = r.state();
    const std::string rng_before = r.step.rng_state();
    const auto grads =
        rank == bad_rank ? bad_gradients(rank, kBad, std::nanf("")) : gradients(rank, kBad);
    if (skip) {
      EXPECT_FALSE(r.run(grads)) << "rank " << rank;
      ++skipped;
      for (const auto& d : r.directions) {
        EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](float x) { return x == 0.0f; }));
      }
      EXPECT_EQ(r.step.iteration(), kBad + 1);
      EXPECT_EQ(r.step.skipped_steps(), 1);
      EXPECT_EQ(r.step.last_bad_ranks(), 1);
    } else {
      try {
        r.run(grads);
        ADD_FAILURE() << "rank " << rank << " did not throw";
      } catch (const NumericError& e) {
        std::lock_guard<std::mutex> lock(mutex);
        messages.push_back(e.what());
      }
      EXPECT_EQ(r.step.iteration(), kBad);
      EXPECT_EQ(r.step.skipped_steps(), 0);
    }
    EXPECT_EQ(r.state(), before) << "rank " << rank << ": the bad step changed the state";
    EXPECT_EQ(r.step.rng_state(), rng_before) << "rank " << rank;
    // The next good step equals that of the run that never saw the bad step.
    ASSERT_TRUE(r.run(gradients(rank, kBad + 1)));
    EXPECT_EQ(r.directions, reference_directions[rank]) << "rank " << rank;
    EXPECT_EQ(r.state(), reference[rank]) << "rank " << rank;
    EXPECT_EQ(r.step.rng_state(), reference_rng[rank]) << "rank " << rank;
    EXPECT_EQ(r.step.consecutive_skips(), 0);
  });
  if (skip) {
    EXPECT_EQ(skipped, world);
  } else {
    ASSERT_EQ(messages.size(), static_cast<size_t>(world));
    for (const auto& m : messages) {
      EXPECT_NE(m.find(detail::concat("on 1 of ", world, " rank(s) at iteration 2")),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("Nothing was applied"), std::string::npos) << m;
      EXPECT_NE(m.find("--clip-norm"), std::string::npos) << m;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return detail::concat(info.param.policy == NonFinitePolicy::kSkip ? "skip" : "stop", "_",
                        info.param.world, "ranks_", to_string(info.param.dense_path));
}

INSTANTIATE_TEST_SUITE_P(Worlds, NonFinitePolicyTest,
                         ::testing::Values(Case{1, NonFinitePolicy::kStop, DensePath::kGrouped},
                                           Case{2, NonFinitePolicy::kStop, DensePath::kFloat16},
                                           Case{4, NonFinitePolicy::kStop, DensePath::kGrouped},
                                           Case{1, NonFinitePolicy::kSkip, DensePath::kGrouped},
                                           Case{2, NonFinitePolicy::kSkip, DensePath::kGrouped},
                                           Case{2, NonFinitePolicy::kSkip, DensePath::kFloat16},
                                           Case{2, NonFinitePolicy::kSkip, DensePath::kExact},
                                           Case{4, NonFinitePolicy::kSkip, DensePath::kGrouped},
                                           Case{4, NonFinitePolicy::kSkip, DensePath::kBFloat16}),
                         case_name);

// An infinity on every rank at once is skipped too, and a velocity that overflows (a finite but
// huge gradient) is reported like a bad gradient: skipped, nothing kept.
TEST(NonFinitePolicy, InfinityAndOverflowAreSkippedLikeNaN) {
  auto options = make_options(NonFinitePolicy::kSkip, DensePath::kGrouped);
  options.clip_norm = 0.0;                      // let the huge gradient reach the velocity
  options.compressor.momentum.masking = false;  // so that u keeps it after the send
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Rank r(comm, options);
    ASSERT_TRUE(r.run(gradients(comm.rank(), 0)));
    const auto before = r.state();
    EXPECT_FALSE(r.run(bad_gradients(comm.rank(), 1, INFINITY)));
    EXPECT_EQ(r.step.last_bad_ranks(), 2);
    EXPECT_EQ(r.state(), before);
    auto huge = gradients(comm.rank(), 2);
    if (comm.rank() == 0) huge[0][0] = 3e38f;
    ASSERT_TRUE(r.run(huge)) << "one finite huge step fits in fp32";
    const auto after_huge = r.state();
    // u = 0.9 * 3e38 + 3e38 overflows on rank 0, with a finite gradient.
    EXPECT_FALSE(r.run(huge)) << "the velocity overflowed on rank 0: skipped on every rank";
    EXPECT_EQ(r.step.last_bad_ranks(), 1);
    EXPECT_EQ(r.state(), after_huge);
    EXPECT_EQ(r.step.skipped_steps(), 2);
  });
}

TEST(NonFinitePolicy, MoreSkipsInARowThanAllowedStopTheRun) {
  auto options = make_options(NonFinitePolicy::kSkip, DensePath::kGrouped);
  options.max_consecutive_skips = 2;
  std::atomic<int> threw{0};
  comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
    Rank r(comm, options);
    const int rank = comm.rank();
    const auto step = [&](int s, bool bad) {
      return r.run(bad && rank == 1 ? bad_gradients(rank, s, std::nanf("")) : gradients(rank, s));
    };
    ASSERT_TRUE(step(0, false));
    EXPECT_FALSE(step(1, true));
    EXPECT_FALSE(step(2, true));
    EXPECT_TRUE(step(3, false)) << "a good step ends the run of skips";
    EXPECT_FALSE(step(4, true));
    EXPECT_FALSE(step(5, true));
    EXPECT_EQ(r.step.consecutive_skips(), 2);
    const auto before = r.state();
    try {
      step(6, true);
      ADD_FAILURE() << "rank " << rank << ": a third skip in a row did not stop the run";
    } catch (const NumericError& e) {
      ++threw;
      const std::string m = e.what();
      EXPECT_NE(m.find("3 bad steps in a row"), std::string::npos) << m;
      EXPECT_NE(m.find("--max-consecutive-skips"), std::string::npos) << m;
    }
    EXPECT_EQ(r.state(), before);
    EXPECT_EQ(r.step.iteration(), 6);
    EXPECT_EQ(r.step.skipped_steps(), 4);
  });
  EXPECT_EQ(threw, 2);
}

TEST(NonFinitePolicy, RanksWithAnotherPolicyStopAtTheHandshake) {
  for (const bool other_limit : {false, true}) {
    std::atomic<int> refused{0};
    comm::run_local(2, gloo_options(), [&](comm::Communicator& comm) {
      auto options = make_options(NonFinitePolicy::kSkip, DensePath::kGrouped);
      if (comm.rank() == 1) {
        if (other_limit) {
          options.max_consecutive_skips = 3;
        } else {
          options.on_nonfinite = NonFinitePolicy::kStop;
        }
      }
      try {
        DistributedStep step(comm, kShapes, options);
      } catch (const MismatchError& e) {
        ++refused;
        const std::string m = e.what();
        EXPECT_NE(m.find(other_limit ? "max_consecutive_skips" : "on_nonfinite"), std::string::npos)
            << m;
      }
    });
    EXPECT_EQ(refused, 2) << (other_limit ? "max_consecutive_skips" : "on_nonfinite");
  }
}

TEST(NonFinitePolicy, ParsesAndDescribes) {
  EXPECT_EQ(parse_nonfinite_policy("stop"), NonFinitePolicy::kStop);
  EXPECT_EQ(parse_nonfinite_policy("skip"), NonFinitePolicy::kSkip);
  EXPECT_THROW(parse_nonfinite_policy("ignore"), InvalidArgument);
  OptimizerOptions o;
  EXPECT_NE(describe(o).find("max_consecutive_skips=10\non_nonfinite=stop\n"), std::string::npos);
  o.on_nonfinite = NonFinitePolicy::kSkip;
  o.max_consecutive_skips = 7;
  EXPECT_NE(describe(o).find("max_consecutive_skips=7\non_nonfinite=skip\n"), std::string::npos);
  o.max_consecutive_skips = 0;
  comm::run_local(1, gloo_options(), [&](comm::Communicator& comm) {
    EXPECT_THROW(DistributedStep(comm, kShapes, o), InvalidArgument);
  });
}

}  // namespace
}  // namespace dgc::train
