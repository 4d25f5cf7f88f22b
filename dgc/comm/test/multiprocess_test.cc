// Real multi-process runs of comm_worker: four processes meeting through MASTER_ADDR/MASTER_PORT
// on 127.0.0.1, four through a shared directory, `mpirun -np 4`; and the failures that must end
// in an error on every survivor, never a hang (a SIGKILLed peer, a stalled MPI rank, a process
// started with another WORLD_SIZE).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dgc/comm/test/test_process.h"
#include "dgc/comm/test/worker_common.h"

namespace dgc::test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kWorld = 4;

std::vector<std::string> torchrun_env(int rank, int world, int port) {
  std::vector<std::string> env = kNoLaunchVars;
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(world));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  return env;
}

std::vector<std::string> mpirun_command(int np, const std::vector<std::string>& worker_args) {
  std::vector<std::string> cmd = {
      DGC_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
      "-np",       std::to_string(np),    DGC_COMM_WORKER};
  cmd.insert(cmd.end(), worker_args.begin(), worker_args.end());
  return cmd;
}

std::vector<std::string> mpirun_env() {
  std::vector<std::string> env = kNoLaunchVars;
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  return env;
}

// Waits for every process (bounded); returns false if one is still running at the deadline.
bool wait_all(std::vector<std::unique_ptr<Process>>& procs, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (auto& p : procs) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (!p->wait_for(std::max(left, milliseconds(0)))) return false;
  }
  return true;
}

TEST(MultiProcess, FourProcessesThroughMasterAddrAndPort) {
  TempDir dir("dgc-comm-tcp-");
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < kWorld; ++r) {
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{DGC_COMM_WORKER, "collectives", "--timeout-ms", "20000"},
        torchrun_env(r, kWorld, port), dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  ASSERT_TRUE(wait_all(procs, milliseconds(60000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(procs[r]->exit_code(), kExitOk) << all_output(procs);
    EXPECT_NE(procs[r]->output().find("collectives ok"), std::string::npos) << all_output(procs);
  }
}

TEST(MultiProcess, FourProcessesThroughASharedDirectory) {
  TempDir dir("dgc-comm-file-");
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < kWorld; ++r) {
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{DGC_COMM_WORKER, "collectives", "--file", dir.path() + "/store",
                                 "--rank", std::to_string(r), "--world", std::to_string(kWorld),
                                 "--timeout-ms", "20000"},
        kNoLaunchVars, dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  ASSERT_TRUE(wait_all(procs, milliseconds(60000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(procs[r]->exit_code(), kExitOk) << all_output(procs);
  }
}

TEST(MultiProcess, MpirunFourRanks) {
  if (!DGC_WITH_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir("dgc-comm-mpi-");
  Process mpirun(mpirun_command(kWorld, {"collectives", "--timeout-ms", "20000"}), mpirun_env(),
                 dir.path() + "/mpirun.log");
  ASSERT_TRUE(mpirun.wait_for(milliseconds(90000))) << mpirun.output();
  EXPECT_EQ(mpirun.exit_code(), kExitOk) << mpirun.output();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(mpirun.output().find("rank " + std::to_string(r) + " of 4 (mpi): collectives ok"),
              std::string::npos)
        << mpirun.output();
  }
}

TEST(MultiProcess, KilledPeerEndsEverySurvivorWithAnErrorWithinTheTimeout) {
  TempDir dir("dgc-comm-kill-");
  const int port = free_port();
  // Also the rendezvous timeout: the four processes must all have started within it, and each
  // loads libtorch (seconds, on a loaded machine). The survivors end within tens of ms anyway.
  const int timeout_ms = 10000;
  constexpr int victim = 2;
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < kWorld; ++r) {
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{DGC_COMM_WORKER, "loop", "--iterations", "100000", "--timeout-ms",
                                 std::to_string(timeout_ms)},
        torchrun_env(r, kWorld, port), dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  // Mid-run: every rank has finished some iterations.
  const auto deadline = Clock::now() + milliseconds(60000);
  bool running = false;
  while (!running && Clock::now() < deadline) {
    running = true;
    for (int r = 0; r < kWorld; ++r) {
      running = running && procs[r]->output().find("rank " + std::to_string(r) + " iteration 20") !=
                               std::string::npos;
    }
    if (!running) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(running) << all_output(procs);

  procs[victim]->signal(SIGKILL);
  const auto killed_at = Clock::now();
  for (int r = 0; r < kWorld; ++r) {
    if (r == victim) continue;
    ASSERT_TRUE(procs[r]->wait_for(milliseconds(timeout_ms + 5000)))
        << "rank " << r << " still running " << timeout_ms + 5000 << " ms after the kill\n"
        << all_output(procs);
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at);
    const std::string out = procs[r]->output();
    const auto code = procs[r]->exit_code();
    EXPECT_TRUE(code == kExitComm || code == kExitTimeout) << "rank " << r << "\n" << out;
    EXPECT_NE(out.find("error: "), std::string::npos) << out;
    std::printf("rank %d ended %lld ms after the kill: %s", r,
                static_cast<long long>(elapsed.count()), out.substr(out.find("error: ")).c_str());
  }
  // At least one survivor (a ring neighbour of the victim) names it.
  std::string survivors;
  for (int r = 0; r < kWorld; ++r) {
    if (r != victim) survivors += procs[r]->output();
  }
  EXPECT_NE(survivors.find("peer rank " + std::to_string(victim)), std::string::npos) << survivors;
}

TEST(MultiProcess, StalledMpiRankEndsInATimeoutError) {
  if (!DGC_WITH_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir("dgc-comm-mpistall-");
  const int timeout_ms = 2000;
  Process mpirun(
      mpirun_command(kWorld, {"loop", "--iterations", "1000", "--stall-rank", "3", "--stall-at",
                              "5", "--timeout-ms", std::to_string(timeout_ms)}),
      mpirun_env(), dir.path() + "/mpirun.log");
  // Wait for the stall, then time the survivors' errors from there.
  const auto deadline = Clock::now() + milliseconds(60000);
  while (mpirun.output().find("stalls at iteration 5") == std::string::npos &&
         Clock::now() < deadline && !mpirun.wait_for(milliseconds(0))) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  const auto stalled_at = Clock::now();
  ASSERT_TRUE(mpirun.wait_for(milliseconds(timeout_ms + 8000))) << mpirun.output();
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - stalled_at);
  const std::string out = mpirun.output();
  EXPECT_NE(mpirun.exit_code(), kExitOk) << out;
  EXPECT_NE(out.find("error: TimeoutError: mpi "), std::string::npos) << out;
  EXPECT_NE(out.find("timed out"), std::string::npos) << out;
  std::printf("mpirun ended %lld ms after the stall\n", static_cast<long long>(elapsed.count()));
}

TEST(MultiProcess, WorldSizeMismatchIsAnErrorOnEveryRankNotAHang) {
  TempDir dir("dgc-comm-ws-");
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < kWorld; ++r) {
    const int world = r == 1 ? 3 : kWorld;  // rank 1 was given another WORLD_SIZE
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{DGC_COMM_WORKER, "collectives", "--timeout-ms", "60000"},
        torchrun_env(r, world, port), dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  // Every rank exits with the MismatchError, not the rendezvous TimeoutError (60 s): ~10 ms after
  // the processes start, unloaded. The bound is generous because their start-up (loading
  // libtorch, ~1.4 s of CPU each) takes tens of seconds on a heavily loaded 2-core machine.
  ASSERT_TRUE(wait_all(procs, milliseconds(100000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), kExitMismatch) << out;
    EXPECT_NE(out.find("world size mismatch"), std::string::npos) << out;
    EXPECT_NE(out.find("WORLD_SIZE=3"), std::string::npos) << out;
  }
}

// The mismatched rank starts before the master and two ranks start a second later: the master
// keeps serving the refusal, so the late ranks learn why instead of finding the store gone.
TEST(MultiProcess, LateRanksLearnOfAWorldSizeMismatch) {
  TempDir dir("dgc-comm-ws-late-");
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  auto start = [&](int r, int world) {
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{DGC_COMM_WORKER, "collectives", "--timeout-ms", "60000"},
        torchrun_env(r, world, port), dir.path() + "/rank" + std::to_string(r) + ".log"));
  };
  start(1, 3);
  std::this_thread::sleep_for(milliseconds(300));
  start(0, kWorld);
  std::this_thread::sleep_for(milliseconds(1000));
  start(2, kWorld);
  start(3, kWorld);
  ASSERT_TRUE(wait_all(procs, milliseconds(100000))) << all_output(procs);
  for (const auto& p : procs) {
    EXPECT_EQ(p->exit_code(), kExitMismatch) << p->output();
    EXPECT_NE(p->output().find("WORLD_SIZE=3"), std::string::npos) << p->output();
  }
}

}  // namespace
}  // namespace dgc::test
