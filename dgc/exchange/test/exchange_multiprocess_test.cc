// The exchange across real processes: `mpirun -np 4`, and four processes meeting through
// MASTER_ADDR/MASTER_PORT on 127.0.0.1; a layout mismatch stops every process with the same
// MismatchError.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dgc/comm/test/test_process.h"
#include "dgc/comm/test/worker_common.h"

namespace dgc::test {
namespace {

using std::chrono::milliseconds;

constexpr int kWorld = 4;

std::vector<std::unique_ptr<Process>> start_torchrun(const TempDir& dir,
                                                     const std::vector<std::string>& args) {
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> env = kNoLaunchVars;
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(kWorld));
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
  TempDir dir("dgc-exchange-tcp-");
  auto procs = start_torchrun(dir, {"run", "--iterations", "4", "--timeout-ms", "20000"});
  for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(60000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(procs[r]->exit_code(), kExitOk) << all_output(procs);
    EXPECT_NE(procs[r]->output().find("exchange ok"), std::string::npos) << all_output(procs);
  }
  std::printf("%s", procs[0]->output().c_str());
}

TEST(ExchangeMultiProcess, MpirunFourRanks) {
  if (!DGC_WITH_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir("dgc-exchange-mpi-");
  std::vector<std::string> env = kNoLaunchVars;
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  Process mpirun({DGC_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
                  std::to_string(kWorld), DGC_EXCHANGE_WORKER, "run", "--iterations", "4",
                  "--timeout-ms", "20000"},
                 env, dir.path() + "/mpirun.log");
  ASSERT_TRUE(mpirun.wait_for(milliseconds(90000))) << mpirun.output();
  EXPECT_EQ(mpirun.exit_code(), kExitOk) << mpirun.output();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(mpirun.output().find("rank " + std::to_string(r) + " of 4 (mpi): exchange ok"),
              std::string::npos)
        << mpirun.output();
  }
}

TEST(ExchangeMultiProcess, LayoutMismatchStopsEveryProcessWithTheSameError) {
  TempDir dir("dgc-exchange-mismatch-");
  auto procs = start_torchrun(dir, {"run", "--mismatch-rank", "2", "--timeout-ms", "60000"});
  // The handshake fails at once on every rank: the mismatch, not the 60 s timeout, ends them (checked below); the bound is generous because
  // process start-up (loading libtorch) takes tens of seconds on a heavily loaded machine.
  for (auto& p : procs) ASSERT_TRUE(p->wait_for(milliseconds(100000))) << all_output(procs);
  for (int r = 0; r < kWorld; ++r) {
    const std::string out = procs[r]->output();
    EXPECT_EQ(procs[r]->exit_code(), kExitMismatch) << out;
    EXPECT_NE(out.find("tensor 2 ('fc.weight')"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 0 has 'fc.weight' shape [10, 300]"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 2 has 'fc.weight' shape [10, 301]"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace dgc::test
