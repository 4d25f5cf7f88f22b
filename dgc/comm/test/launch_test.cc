// detect_launch() and parse_backend(): which launcher started us, and clear errors for partial or
// inconsistent variables.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "dgc/comm/launch.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

const char* kVariables[] = {
    "RANK",     "WORLD_SIZE",           "MASTER_ADDR", "MASTER_PORT",
    "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",    "OMPI_COMM_WORLD_SIZE"};

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
  EXPECT_EQ(launch.master_addr, "10.0.0.1");
  EXPECT_EQ(launch.master_port, 29500);
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
