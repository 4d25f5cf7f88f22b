// detect_launch(), check_launch(), threads_per_worker() and parse_backend(): which launcher
// started us (torchrun's agent included), the rules every command shares, and clear errors for
// partial or inconsistent variables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

const char* kVariables[] = {"RANK",
                            "WORLD_SIZE",
                            "MASTER_ADDR",
                            "MASTER_PORT",
                            "PMI_RANK",
                            "OMPI_COMM_WORLD_RANK",
                            "PMI_SIZE",
                            "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                            "LOCAL_RANK",
                            "LOCAL_WORLD_SIZE",
                            "GROUP_RANK",
                            "TORCHELASTIC_RUN_ID",
                            "TORCHELASTIC_RESTART_COUNT",
                            "TORCHELASTIC_USE_AGENT_STORE",
                            "OMP_NUM_THREADS"};

// Sets exactly `vars` among the launch variables for the life of the object, then restores.
class Environment {
 public:
  explicit Environment(const std::map<std::string, std::string>& vars) {
    for (const char* name : kVariables) {
      if (const char* old = std::getenv(name)) saved_[name] = old;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~Environment() {
    for (const char* name : kVariables) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::string error_of(const std::map<std::string, std::string>& vars) {
  Environment env(vars);
  try {
    detect_launch();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(DetectLaunch, NothingSetIsALocalRun) {
  Environment env({});
  const auto launch = detect_launch();
  EXPECT_EQ(launch.kind, LaunchEnv::Kind::kLocal);
  EXPECT_EQ(launch.rank, 0);
  EXPECT_EQ(launch.world_size, 1);
}

TEST(DetectLaunch, TorchrunVariables) {
  Environment env(
      {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  const auto launch = detect_launch();
  EXPECT_EQ(launch.kind, LaunchEnv::Kind::kTorchrun);
  EXPECT_EQ(launch.rank, 2);
  EXPECT_EQ(launch.world_size, 4);
  EXPECT_EQ(launch.tcp.master_addr, "10.0.0.1");
  EXPECT_EQ(launch.tcp.master_port, 29500);
  // Not torchrun's agent: rank 0 serves the store; keys under "dgc".
  EXPECT_FALSE(launch.torchrun_agent);
  EXPECT_FALSE(launch.tcp.agent_store);
  EXPECT_EQ(launch.tcp.key_prefix, "dgc");
  EXPECT_EQ(launch.description(),
            "MASTER_ADDR/MASTER_PORT (rank 0 serves the store at 10.0.0.1:29500)");
}

// What torchrun's agent sets (local_elastic_agent.py, static rendezvous).
std::map<std::string, std::string> torchrun_agent_vars() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"TORCHELASTIC_RUN_ID", "job7"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"OMP_NUM_THREADS", "1"}};
}

TEST(DetectLaunch, TorchrunAgentVariables) {
  Environment env(torchrun_agent_vars());
  const auto launch = detect_launch();
  EXPECT_EQ(launch.kind, LaunchEnv::Kind::kTorchrun);
  EXPECT_TRUE(launch.torchrun_agent);
  EXPECT_TRUE(launch.tcp.agent_store);
  EXPECT_EQ(launch.run_id, "job7");
  EXPECT_EQ(launch.restart_count, 2);
  EXPECT_EQ(launch.group_rank, 1);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.local_world_size, 2);
  EXPECT_EQ(launch.omp_num_threads, 1);
  // One attempt of one run: never the agent's keys, never an earlier attempt's.
  EXPECT_EQ(launch.tcp.key_prefix, "dgc/job7/attempt_2");
  EXPECT_EQ(launch.description(), "torchrun (agent store at 127.0.0.1:29500), node 1, restart 2");
}

TEST(DetectLaunch, TorchrunWithoutAgentStoreHasRankZeroServe) {
  auto vars = torchrun_agent_vars();
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // torchrun --standalone / c10d rendezvous
  Environment env(vars);
  const auto launch = detect_launch();
  EXPECT_FALSE(launch.tcp.agent_store);
  EXPECT_EQ(launch.tcp.key_prefix, "dgc/job7/attempt_2");
  EXPECT_NE(launch.description().find("rank 0 serves the store"), std::string::npos);
}

TEST(DetectLaunch, BadTorchrunAgentVariablesAreNamed) {
  auto vars = torchrun_agent_vars();
  vars.erase("TORCHELASTIC_RESTART_COUNT");
  EXPECT_NE(error_of(vars).find("TORCHELASTIC_RESTART_COUNT is not set"), std::string::npos);
  vars = torchrun_agent_vars();
  vars["LOCAL_WORLD_SIZE"] = "8";
  EXPECT_NE(error_of(vars).find("LOCAL_WORLD_SIZE=8 is more than WORLD_SIZE=4"), std::string::npos);
  vars = torchrun_agent_vars();
  vars["LOCAL_RANK"] = "2";
  EXPECT_NE(error_of(vars).find("LOCAL_RANK=2 must be less than LOCAL_WORLD_SIZE=2"),
            std::string::npos);
  vars = torchrun_agent_vars();
  vars["OMP_NUM_THREADS"] = "0";
  EXPECT_NE(error_of(vars).find("OMP_NUM_THREADS=0 is outside"), std::string::npos);
}

TEST(ThreadsPerWorker, ProcessesOnOneHostShareItsCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  {
    Environment env({});
    EXPECT_EQ(threads_per_worker(detect_launch(), 1), cores);
    EXPECT_EQ(threads_per_worker(detect_launch(), 2), std::max(1, cores / 2));
    EXPECT_EQ(local_workers(detect_launch(), 0), kDefaultLocalWorkers);
  }
  auto vars = torchrun_agent_vars();
  vars.erase("OMP_NUM_THREADS");
  {
    Environment env(vars);  // LOCAL_WORLD_SIZE=2
    EXPECT_EQ(local_workers(detect_launch(), 0), 2);
    EXPECT_EQ(threads_per_worker(detect_launch(), 0), std::max(1, cores / 2));
  }
  vars["OMP_NUM_THREADS"] = "3";  // the user's (or torchrun's) choice wins
  {
    Environment env(vars);
    EXPECT_EQ(threads_per_worker(detect_launch(), 0), 3);
  }
  {
    Environment env({{"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    EXPECT_EQ(threads_per_worker(detect_launch(), 0), std::max(1, cores / 4));
  }
}

// The rules every command shares (comm::connect checks them before connecting).
std::string check_error(const std::map<std::string, std::string>& vars,
                        const ConnectOptions& options) {
  Environment env(vars);
  try {
    check_launch(detect_launch(), options);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(CheckLaunch, SameRulesForEveryCommand) {
  const std::map<std::string, std::string> local,
      mpi = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  const auto torchrun = torchrun_agent_vars();
  ConnectOptions o;
  EXPECT_EQ(check_error(local, o), "no error");
  EXPECT_EQ(check_error(mpi, o), "no error");
  EXPECT_EQ(check_error(torchrun, o), "no error");

  o.backend = Backend::kMpi;
  EXPECT_NE(check_error(local, o).find("--backend mpi needs one process per rank"),
            std::string::npos);
  EXPECT_NE(check_error(torchrun, o)
                .find("--backend mpi needs mpirun, but this process was "
                      "started by torchrun (agent store"),
            std::string::npos);
  EXPECT_EQ(check_error(mpi, o), "no error");

  o.backend = Backend::kGloo;
  EXPECT_NE(check_error(mpi, o).find("--backend gloo under mpirun needs --rendezvous DIR"),
            std::string::npos);
  o.rendezvous = "/some/dir";
  EXPECT_EQ(check_error(mpi, o), "no error");
  EXPECT_EQ(check_error(torchrun, o), "no error");
  EXPECT_NE(check_error(local, o).find("drop --rendezvous"), std::string::npos);

  ConnectOptions w;
  w.workers = 3;
  EXPECT_EQ(check_error(local, w), "no error");
  EXPECT_NE(check_error(torchrun, w).find("--workers 3 but torchrun"), std::string::npos);
  EXPECT_NE(check_error(mpi, w).find("--workers 3 but mpirun started 2 processes"),
            std::string::npos);
  w.workers = 4;
  EXPECT_EQ(check_error(torchrun, w), "no error");
}

TEST(DetectLaunch, OpenMpiVariables) {
  Environment env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
  const auto launch = detect_launch();
  EXPECT_EQ(launch.kind, LaunchEnv::Kind::kMpi);
  EXPECT_EQ(launch.rank, 1);
  EXPECT_EQ(launch.world_size, 3);
}

TEST(DetectLaunch, PmiVariables) {
  Environment env({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(detect_launch().kind, LaunchEnv::Kind::kMpi);
}

TEST(DetectLaunch, PartialTorchrunVariablesNameWhatIsMissing) {
  const auto what = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(what.find("MASTER_ADDR, MASTER_PORT not"), std::string::npos) << what;
  const auto what2 = error_of({{"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_NE(what2.find("RANK, WORLD_SIZE, MASTER_PORT not"), std::string::npos) << what2;
}

TEST(DetectLaunch, BadValuesAreNamed) {
  const std::map<std::string, std::string> ok = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const char* name, const char* value) {
    auto vars = ok;
    vars[name] = value;
    return error_of(vars);
  };
  EXPECT_NE(with("RANK", "two").find("RANK='two' is not an integer"), std::string::npos);
  EXPECT_NE(with("RANK", "2").find("RANK=2 must be less than WORLD_SIZE=2"), std::string::npos);
  EXPECT_NE(with("WORLD_SIZE", "0").find("WORLD_SIZE=0 is outside"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "70000").find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(with("MASTER_ADDR", "").find("MASTER_ADDR is set but empty"), std::string::npos);
  EXPECT_NE(with("RANK", "-1").find("RANK=-1 is outside"), std::string::npos);
}

TEST(DetectLaunch, PartialMpiVariables) {
  const auto what = error_of({{"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_NE(what.find("OMPI_COMM_WORLD_SIZE is not set"), std::string::npos) << what;
  const auto what2 = error_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
  EXPECT_NE(what2.find("must be less than"), std::string::npos) << what2;
}

TEST(DetectLaunch, TorchrunAndMpiMustAgree) {
  std::map<std::string, std::string> vars = {
      {"RANK", "1"},        {"WORLD_SIZE", "2"},           {"MASTER_ADDR", "h"},
      {"MASTER_PORT", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  EXPECT_NE(error_of(vars).find("disagree"), std::string::npos);
  vars["OMPI_COMM_WORLD_RANK"] = "1";
  Environment env(vars);
  EXPECT_EQ(detect_launch().kind, LaunchEnv::Kind::kTorchrun);
}

TEST(Backend, ParseAndPrint) {
  EXPECT_EQ(parse_backend("gloo"), Backend::kGloo);
  EXPECT_EQ(parse_backend("mpi"), Backend::kMpi);
  EXPECT_EQ(to_string(Backend::kGloo), "gloo");
  EXPECT_EQ(to_string(Backend::kMpi), "mpi");
  EXPECT_THROW(parse_backend("nccl"), InvalidArgument);
}

TEST(ConnectMpi, OutsideMpirunIsAClearError) {
  Environment env({});
  if (!have_mpi()) {
    EXPECT_THROW(connect_mpi(), CommError);
    return;
  }
  if (std::getenv("PMIX_RANK") != nullptr) GTEST_SKIP() << "running under mpirun";
  try {
    connect_mpi(std::chrono::milliseconds(1000));
    FAIL() << "connect_mpi must refuse to start outside mpirun";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dgc::comm
