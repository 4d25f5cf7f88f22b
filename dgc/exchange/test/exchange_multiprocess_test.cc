// The exchange across real processes, with every algorithm: `mpirun -np 4`, and four processes
// meeting through MASTER_ADDR/MASTER_PORT on 127.0.0.1; a layout or algorithm mismatch stops
// every process with the same MismatchError; a killed peer during each algorithm ends every
// survivor with an error within the timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dgc/comm/test/test_process.h"
#include "dgc/comm/test/worker_common.h"

namespace dgc::test {
namespace {

using std::chrono::milliseconds;

constexpr int kWorld = 4;
const char* const kAlgorithms[] = {"allgather", "direct", "sparse-allreduce"};

// `secret(rank)`: the DGC_JOB_SECRET of each rank ("" for none).
std::vector<std::unique_ptr<Process>> start_torchrun(
    const TempDir& dir, const std::vector<std::string>& args, int world = kWorld,
    const std::function<std::string(int)>& secret = [](int) { return std::string(); }) {
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env = kNoLaunchVars;
    if (!secret(r).empty()) env.push_back("DGC_JOB_SECRET=" + secret(r));
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    std::vector<std::string> argv = {DGC_EXCHANGE_WORKER};
    argv.insert(argv.end(), args.begin(), args.end());
    procs.push_back(
        std::make_unique<Process>(argv, env, dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  return procs;
}

TEST(ExchangeMultiProcess, FourProcessesThroughMasterAddrAndPort) {
  for (int a = 0; a < 3; ++a) {
    TempDir dir("dgc-exchange-tcp-");
    auto procs = start_torchrun(dir, {"run", "--iterations", "4", "--exchange", std::to_string(a),
                                      "--timeout-ms", "20000"});
    for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(60000))) << all_output(procs);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(procs[r]->exit_code(), kExitOk) << all_output(procs);
      EXPECT_NE(procs[r]->output().find(std::string(kAlgorithms[a]) + "): exchange ok"),
                std::string::npos)
          << all_output(procs);
    }
    const std::string out = procs[0]->output();
    std::printf("%s", out.substr(out.find("rank 0 of")).c_str());
  }
}

TEST(ExchangeMultiProcess, MpirunFourRanks) {
  if (!DGC_WITH_MPI) GTEST_SKIP() << "built without MPI";
  for (int a = 0; a < 3; ++a) {
    TempDir dir("dgc-exchange-mpi-");
    std::vector<std::string> env = kNoLaunchVars;
    env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
    env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
    Process mpirun({DGC_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                    "-np", std::to_string(kWorld), DGC_EXCHANGE_WORKER, "run", "--iterations", "4",
                    "--exchange", std::to_string(a), "--timeout-ms", "20000"},
                   env, dir.path() + "/mpirun.log");
    ASSERT_TRUE(mpirun.wait_for(milliseconds(90000))) << mpirun.output();
    EXPECT_EQ(mpirun.exit_code(), kExitOk) << mpirun.output();
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_NE(mpirun.output().find("rank " + std::to_string(r) + " of 4 (mpi, " + kAlgorithms[a] +
                                     "): exchange ok"),
                std::string::npos)
          << mpirun.output();
    }
  }
}

TEST(ExchangeMultiProcess, AlgorithmMismatchStopsEveryProcessWithTheSameError) {
  TempDir dir("dgc-exchange-algorithm-mismatch-");
  auto procs = start_torchrun(
      dir, {"run", "--exchange", "1", "--mismatch-exchange-rank", "3", "--timeout-ms", "30000"});
  for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(20000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), kExitMismatch) << out;
    EXPECT_NE(out.find("setting 'exchange.algorithm'"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 0 has 'direct (direct)'"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 3 has 'sparse-allreduce (sparse-allreduce)'"), std::string::npos)
        << out;
  }
}

// A peer SIGKILLed in the middle of a run: every survivor ends with a CommError or TimeoutError
// well within the timeout, for each algorithm.
TEST(ExchangeMultiProcess, KilledPeerDuringEachAlgorithmIsAnErrorOnEverySurvivor) {
  using Clock = std::chrono::steady_clock;
  constexpr int victim = 2;
  const int timeout_ms = 3000;
  for (int a = 0; a < 3; ++a) {
    TempDir dir("dgc-exchange-kill-");
    auto procs =
        start_torchrun(dir, {"run", "--iterations", "100000", "--exchange", std::to_string(a),
                             "--timeout-ms", std::to_string(timeout_ms)});
    const auto deadline = Clock::now() + milliseconds(60000);
    bool running = false;
    while (!running && Clock::now() < deadline) {
      running = true;
      for (int r = 0; r < kWorld; ++r) {
        running = running && procs[r]->output().find("rank " + std::to_string(r) +
                                                     " iteration 10\n") != std::string::npos;
      }
      if (!running) std::this_thread::sleep_for(milliseconds(20));
    }
    ASSERT_TRUE(running) << kAlgorithms[a] << "\n" << all_output(procs);
    procs[victim]->signal(SIGKILL);
    const auto killed_at = Clock::now();
    for (int r = 0; r < kWorld; ++r) {
      if (r == victim) continue;
      ASSERT_TRUE(procs[r]->wait_for(milliseconds(timeout_ms + 5000)))
          << kAlgorithms[a] << ": rank " << r << " still running after the kill\n"
          << all_output(procs);
      const auto code = procs[r]->exit_code();
      const std::string out = procs[r]->output();
      EXPECT_TRUE(code == kExitComm || code == kExitTimeout) << kAlgorithms[a] << "\n" << out;
      const auto error = out.find("error: ");
      ASSERT_NE(error, std::string::npos) << out;
      std::printf("%s: rank %d ended %lld ms after the kill: %s", kAlgorithms[a], r,
                  static_cast<long long>(
                      std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at).count()),
                  out.substr(error).c_str());
    }
  }
}

TEST(ExchangeMultiProcess, LayoutMismatchStopsEveryProcessWithTheSameError) {
  TempDir dir("dgc-exchange-mismatch-");
  auto procs = start_torchrun(dir, {"run", "--mismatch-rank", "2", "--timeout-ms", "60000"});
  // The handshake fails at once on every rank: the mismatch, not the 60 s timeout, ends them
  // (checked below); the bound is generous because process start-up (loading libtorch) takes tens
  // of seconds on a heavily loaded machine.
  for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(100000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), kExitMismatch) << out;
    EXPECT_NE(out.find("tensor 2 ('fc.weight')"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 0 has 'fc.weight' shape [10, 300]"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 2 has 'fc.weight' shape [10, 301]"), std::string::npos) << out;
  }
}

// ---- job secret ----

constexpr const char* kSecret = "9f1c0d7e5a3b4c2d1e0f9a8b7c6d5e4f";

// The same secret on every rank: rendezvous through the (c10d) TCP store with tagged values, and
// tagged messages, give the reference result.
TEST(ExchangeMultiProcess, FourProcessesWithAJobSecretAuthenticateAndAgree) {
  TempDir dir("dgc-exchange-secret-");
  auto procs =
      start_torchrun(dir, {"run", "--iterations", "3", "--exchange", "1", "--timeout-ms", "20000"},
                     kWorld, [](int) { return std::string(kSecret); });
  for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(60000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(procs[r]->exit_code(), kExitOk) << all_output(procs);
    EXPECT_NE(procs[r]->output().find("(gloo, direct, authenticated): exchange ok"),
              std::string::npos)
        << all_output(procs);
    EXPECT_EQ(procs[r]->output().find(kSecret), std::string::npos) << "the secret was printed";
  }
}

// Two processes given different secrets: each refuses the other's rendezvous value and stops
// with an error that names the key and the secret, long before the 60 s timeout. The key is the
// other's join record, or the abort the other published after refusing ours (it carries the
// other's tag too).
TEST(ExchangeMultiProcess, DifferentSecretsStopBothProcessesWithAClearError) {
  using Clock = std::chrono::steady_clock;
  TempDir dir("dgc-exchange-secrets-differ-");
  const auto start = Clock::now();
  auto procs = start_torchrun(dir, {"run", "--timeout-ms", "60000"}, 2,
                              [](int r) { return std::string(kSecret) + std::to_string(r); });
  // Bounded well under the timeout; process start-up on a loaded machine takes seconds.
  for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(45000))) << all_output(procs);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), kExitOtherError) << out;
    EXPECT_NE(out.find("error: AuthenticationError: rendezvous through"), std::string::npos) << out;
    EXPECT_TRUE(out.find("'dgc.join.") != std::string::npos ||
                out.find("'dgc.abort'") != std::string::npos)
        << "names the key: " << out;
    EXPECT_NE(out.find("job secret"), std::string::npos) << out;
    EXPECT_EQ(out.find(kSecret), std::string::npos) << "the secret was printed: " << out;
  }
  std::printf("different secrets: both processes stopped after %lld ms\n",
              static_cast<long long>(took));
}

// Under mpirun (no rendezvous store: MPI connects the ranks) different secrets are found at the
// exchange handshake, on every rank.
TEST(ExchangeMultiProcess, DifferentSecretsUnderMpirunStopAtTheHandshake) {
  if (!DGC_WITH_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir("dgc-exchange-mpi-secrets-");
  std::vector<std::string> env = kNoLaunchVars;
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  // Each rank's secret from its rank: set by a shell around the worker.
  const std::string worker = std::string("DGC_JOB_SECRET=") + kSecret +
                             "$OMPI_COMM_WORLD_RANK exec " + DGC_EXCHANGE_WORKER +
                             " run --timeout-ms 60000";
  Process mpirun({DGC_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
                  "2", "/bin/sh", "-c", worker},
                 env, dir.path() + "/mpirun.log");
  ASSERT_TRUE(mpirun.wait_for(milliseconds(45000))) << mpirun.output();
  EXPECT_NE(mpirun.exit_code(), kExitOk) << mpirun.output();
  for (const char* rank : {"rank 0", "rank 1"}) {
    EXPECT_NE(mpirun.output().find(std::string("does not carry a valid tag under ") + rank +
                                   "'s job secret"),
              std::string::npos)
        << mpirun.output();
  }
}

}  // namespace
}  // namespace dgc::test
