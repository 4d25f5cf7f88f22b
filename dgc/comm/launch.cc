#include "dgc/comm/launch.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>
#include <vector>

#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int parse_int(const char* name, const std::string& value, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
    throw InvalidArgument(
        detail::concat("environment variable ", name, "='", value, "' is not an integer"));
  }
  if (v < lo || v > hi) {
    throw InvalidArgument(
        detail::concat("environment variable ", name, "=", v, " is outside [", lo, ", ", hi, "]"));
  }
  return static_cast<int>(v);
}

// Reads a (rank, size) pair of variables; nullopt if neither is set, throws if only one is.
std::optional<std::pair<int, int>> rank_and_size(const char* rank_name, const char* size_name,
                                                 const char* launcher) {
  const auto rank = env(rank_name);
  const auto size = env(size_name);
  if (!rank && !size) return std::nullopt;
  if (!rank || !size) {
    throw InvalidArgument(detail::concat(launcher, " launch: ", rank ? size_name : rank_name,
                                         " is not set but ", rank ? rank_name : size_name,
                                         " is; set both (or neither, for a local run)"));
  }
  const int s = parse_int(size_name, *size, 1, INT_MAX);
  const int r = parse_int(rank_name, *rank, 0, INT_MAX);
  if (r >= s) {
    throw InvalidArgument(detail::concat(launcher, " launch: ", rank_name, "=", r,
                                         " must be less than ", size_name, "=", s));
  }
  return std::make_pair(r, s);
}

}  // namespace

Backend parse_backend(const std::string& name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "mpi") return Backend::kMpi;
  throw InvalidArgument(detail::concat("unknown backend '", name, "': expected gloo or mpi"));
}

std::string to_string(Backend backend) { return backend == Backend::kMpi ? "mpi" : "gloo"; }

LaunchEnv detect_launch() {
  // torchrun: all four variables, or none.
  const char* torch_vars[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> set, unset;
  for (const char* v : torch_vars) (env(v) ? set : unset).push_back(v);

  auto mpi = rank_and_size("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI");
  if (!mpi) mpi = rank_and_size("PMI_RANK", "PMI_SIZE", "MPI (PMI)");

  if (!set.empty()) {
    if (!unset.empty()) {
      std::string have, missing;
      for (const auto& s : set) have += (have.empty() ? "" : ", ") + s;
      for (const auto& s : unset) missing += (missing.empty() ? "" : ", ") + s;
      throw InvalidArgument(detail::concat(
          "torchrun-style launch needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ", have,
          " set but ", missing, " not; set all four (or none, for a local run)"));
    }
    LaunchEnv launch;
    launch.kind = LaunchEnv::Kind::kTorchrun;
    launch.world_size = parse_int("WORLD_SIZE", *env("WORLD_SIZE"), 1, INT_MAX);
    launch.rank = parse_int("RANK", *env("RANK"), 0, INT_MAX);
    if (launch.rank >= launch.world_size) {
      throw InvalidArgument(detail::concat("torchrun-style launch: RANK=", launch.rank,
                                           " must be less than WORLD_SIZE=", launch.world_size));
    }
    launch.master_addr = *env("MASTER_ADDR");
    if (launch.master_addr.empty()) throw InvalidArgument("MASTER_ADDR is set but empty");
    launch.master_port = parse_int("MASTER_PORT", *env("MASTER_PORT"), 1, 65535);
    if (mpi && (mpi->first != launch.rank || mpi->second != launch.world_size)) {
      throw InvalidArgument(detail::concat("both torchrun variables (RANK=", launch.rank,
                                           ", WORLD_SIZE=", launch.world_size, ") and MPI's (rank ",
                                           mpi->first, ", size ", mpi->second,
                                           ") are set and disagree; unset one of them"));
    }
    return launch;
  }
  if (mpi) {
    LaunchEnv launch;
    launch.kind = LaunchEnv::Kind::kMpi;
    launch.rank = mpi->first;
    launch.world_size = mpi->second;
    return launch;
  }
  return LaunchEnv{};
}

#if !DGC_WITH_MPI
bool have_mpi() { return false; }

std::unique_ptr<Communicator> connect_mpi(Timeout) {
  throw CommError("this build of dgc has no MPI backend (configured with DGC_WITH_MPI=OFF)");
}
#endif

}  // namespace dgc::comm
