// Shared by the test workers (separate processes that the multi-process tests launch): how a
// worker connects, and how it reports an error through its exit code.
//
//   worker ... [--file DIR --rank R --world N] [--timeout-ms T]
// With --file: Gloo through a shared directory. Otherwise from the environment, through
// comm::connect() as the dgc commands do: torchrun variables -> Gloo over the TCP store; Open
// MPI's -> MPI. With DGC_JOB_SECRET set, the rendezvous values are tagged (job_keys_from_env).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dgc/comm/launch.h"
#include "dgc/core/auth.h"
#include "dgc/core/error.h"

namespace dgc::test {

// Exit codes of the workers; the tests assert on them.
enum ExitCode : int {
  kExitOk = 0,
  kExitCheckFailed = 2,
  kExitMismatch = 3,
  kExitTimeout = 4,
  kExitComm = 5,
  kExitOtherError = 6,
};

// "--name value" pairs; flags without a value are not used by the workers.
// The launcher variables a test clears before starting workers, so that only the ones it sets
// decide how they connect.
inline const std::vector<std::string> kNoLaunchVars = {"RANK",
                                                       "WORLD_SIZE",
                                                       "MASTER_ADDR",
                                                       "MASTER_PORT",
                                                       "OMPI_COMM_WORLD_RANK",
                                                       "OMPI_COMM_WORLD_SIZE",
                                                       "PMI_RANK",
                                                       "PMI_SIZE",
                                                       "LOCAL_RANK",
                                                       "LOCAL_WORLD_SIZE",
                                                       "GROUP_RANK",
                                                       "TORCHELASTIC_RUN_ID",
                                                       "TORCHELASTIC_RESTART_COUNT",
                                                       "TORCHELASTIC_USE_AGENT_STORE",
                                                       "DGC_JOB_SECRET"};

// The job's keys when DGC_JOB_SECRET is set (as the dgc commands read it).
inline std::optional<JobKeys> job_keys_from_env() {
  auto secret = load_job_secret("", std::getenv(kJobSecretEnv));
  if (!secret) return std::nullopt;
  const JobKeys keys = derive_job_keys(*secret);
  wipe(*secret);
  return keys;
}

inline std::map<std::string, std::string> parse_args(int argc, char** argv, int first) {
  std::map<std::string, std::string> args;
  for (int i = first; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  return args;
}

inline std::unique_ptr<comm::Communicator> connect_worker(
    const std::map<std::string, std::string>& args) {
  const auto get = [&](const char* name, const char* fallback) {
    auto it = args.find(name);
    return it == args.end() ? std::string(fallback) : it->second;
  };
  comm::GlooOptions options;
  options.timeout = std::chrono::milliseconds(std::stol(get("--timeout-ms", "10000")));
  if (const auto keys = job_keys_from_env()) options.rendezvous_key = keys->rendezvous;
  if (args.count("--file")) {
    return comm::connect_gloo_file(get("--file", ""), std::stoi(get("--rank", "0")),
                                   std::stoi(get("--world", "1")), options);
  }
  const auto launch = comm::detect_launch();
  if (launch.kind == comm::LaunchEnv::Kind::kLocal) {
    throw InvalidArgument("worker: no --file and no torchrun/MPI launch variables");
  }
  comm::ConnectOptions connect_options;
  connect_options.gloo = options;
  auto connection = comm::connect(launch, connect_options);
  return std::move(connection.ranks.at(0));
}

// Runs body(); maps the exception, if any, to an exit code and prints it as
// "error: <kind>: <message>" on stderr.
inline int run_worker(const std::function<int()>& body) {
  auto report = [](const char* kind, const char* what, int code) {
    std::fprintf(stderr, "error: %s: %s\n", kind, what);
    std::fflush(stderr);
    return code;
  };
  try {
    return body();
  } catch (const MismatchError& e) {
    return report("MismatchError", e.what(), kExitMismatch);
  } catch (const AuthenticationError& e) {
    return report("AuthenticationError", e.what(), kExitOtherError);
  } catch (const TimeoutError& e) {
    return report("TimeoutError", e.what(), kExitTimeout);
  } catch (const CommError& e) {
    return report("CommError", e.what(), kExitComm);
  } catch (const std::exception& e) {
    return report("Error", e.what(), kExitOtherError);
  }
}

}  // namespace dgc::test
