#include "dgc/comm/launch.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <exception>
#include <optional>
#include <thread>
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

std::optional<int> env_int(const char* name, long lo, long hi) {
  const auto value = env(name);
  if (!value) return std::nullopt;
  return parse_int(name, *value, lo, hi);
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
  LaunchEnv launch;
  // torchrun: all four variables, or none.
  const char* torch_vars[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> set, unset;
  for (const char* v : torch_vars) (env(v) ? set : unset).push_back(v);

  auto mpi = rank_and_size("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI");
  if (!mpi) mpi = rank_and_size("PMI_RANK", "PMI_SIZE", "MPI (PMI)");

  if (const auto omp = env_int("OMP_NUM_THREADS", 1, 4096)) launch.omp_num_threads = *omp;

  if (!set.empty()) {
    if (!unset.empty()) {
      std::string have, missing;
      for (const auto& s : set) have += (have.empty() ? "" : ", ") + s;
      for (const auto& s : unset) missing += (missing.empty() ? "" : ", ") + s;
      throw InvalidArgument(detail::concat(
          "torchrun-style launch needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ", have,
          " set but ", missing, " not; set all four (or none, for a local run)"));
    }
    launch.kind = LaunchEnv::Kind::kTorchrun;
    launch.world_size = parse_int("WORLD_SIZE", *env("WORLD_SIZE"), 1, INT_MAX);
    launch.rank = parse_int("RANK", *env("RANK"), 0, INT_MAX);
    if (launch.rank >= launch.world_size) {
      throw InvalidArgument(detail::concat("torchrun-style launch: RANK=", launch.rank,
                                           " must be less than WORLD_SIZE=", launch.world_size));
    }
    launch.tcp.master_addr = *env("MASTER_ADDR");
    if (launch.tcp.master_addr.empty()) throw InvalidArgument("MASTER_ADDR is set but empty");
    launch.tcp.master_port = parse_int("MASTER_PORT", *env("MASTER_PORT"), 1, 65535);
    if (mpi && (mpi->first != launch.rank || mpi->second != launch.world_size)) {
      throw InvalidArgument(detail::concat("both torchrun variables (RANK=", launch.rank,
                                           ", WORLD_SIZE=", launch.world_size, ") and MPI's (rank ",
                                           mpi->first, ", size ", mpi->second,
                                           ") are set and disagree; unset one of them"));
    }

    // What torchrun's agent adds (torch/distributed/elastic/agent/server/local_elastic_agent.py).
    if (const auto run_id = env("TORCHELASTIC_RUN_ID")) {
      launch.torchrun_agent = true;
      launch.run_id = *run_id;
    }
    const auto use_agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
    launch.tcp.agent_store = use_agent_store && *use_agent_store == "True";
    const auto restarts = env_int("TORCHELASTIC_RESTART_COUNT", 0, INT_MAX);
    if (launch.tcp.agent_store && !restarts) {
      throw InvalidArgument(
          "TORCHELASTIC_USE_AGENT_STORE=True but TORCHELASTIC_RESTART_COUNT is not set; both come "
          "from torchrun's agent: start the workers with torchrun, or unset "
          "TORCHELASTIC_USE_AGENT_STORE to have rank 0 serve the store");
    }
    launch.restart_count = restarts.value_or(0);
    // The keys of one attempt of one run, as c10d's PrefixStore would join them.
    launch.tcp.key_prefix = "dgc";
    if (launch.torchrun_agent) {
      launch.tcp.key_prefix +=
          detail::concat("/", launch.run_id, "/attempt_", launch.restart_count);
    }
    if (const auto group = env_int("GROUP_RANK", 0, INT_MAX)) launch.group_rank = *group;
    const auto local_size = env_int("LOCAL_WORLD_SIZE", 1, INT_MAX);
    const auto local_rank = env_int("LOCAL_RANK", 0, INT_MAX);
    if (local_size) {
      if (*local_size > launch.world_size) {
        throw InvalidArgument(detail::concat("LOCAL_WORLD_SIZE=", *local_size,
                                             " is more than WORLD_SIZE=", launch.world_size,
                                             "; it counts the processes on this host"));
      }
      launch.local_world_size = *local_size;
    }
    if (local_rank) {
      if (local_size && *local_rank >= *local_size) {
        throw InvalidArgument(detail::concat("LOCAL_RANK=", *local_rank,
                                             " must be less than LOCAL_WORLD_SIZE=", *local_size));
      }
      launch.local_rank = *local_rank;
    }
    return launch;
  }
  if (mpi) {
    launch.kind = LaunchEnv::Kind::kMpi;
    launch.rank = mpi->first;
    launch.world_size = mpi->second;
    if (const auto n = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT_MAX)) {
      launch.local_world_size = *n;
    }
    if (const auto r = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, INT_MAX)) launch.local_rank = *r;
    return launch;
  }
  return launch;
}

std::string LaunchEnv::description() const {
  switch (kind) {
    case Kind::kLocal:
      return "local threads";
    case Kind::kMpi:
      return "mpirun";
    case Kind::kTorchrun:
      break;
  }
  const std::string at = detail::concat(tcp.master_addr, ":", tcp.master_port);
  std::string out = torchrun_agent ? "torchrun" : "MASTER_ADDR/MASTER_PORT";
  out +=
      tcp.agent_store ? " (agent store at " + at + ")" : " (rank 0 serves the store at " + at + ")";
  if (group_rank >= 0) out += detail::concat(", node ", group_rank);
  if (torchrun_agent && restart_count > 0) out += detail::concat(", restart ", restart_count);
  return out;
}

int local_workers(const LaunchEnv& env, int workers) {
  if (env.kind == LaunchEnv::Kind::kLocal) return workers > 0 ? workers : kDefaultLocalWorkers;
  return env.local_world_size > 0 ? env.local_world_size : 1;
}

int threads_per_worker(const LaunchEnv& env, int workers) {
  if (env.omp_num_threads > 0) return env.omp_num_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_workers(env, workers));
}

void check_launch(const LaunchEnv& env, const ConnectOptions& options) {
  if (options.workers < 0) {
    throw InvalidArgument(detail::concat("--workers must be positive, got ", options.workers));
  }
  switch (env.kind) {
    case LaunchEnv::Kind::kLocal:
      if (options.backend == Backend::kMpi) {
        throw InvalidArgument(
            "--backend mpi needs one process per rank: start the command under `mpirun -np N`");
      }
      if (!options.rendezvous.empty()) {
        throw InvalidArgument(
            "--rendezvous DIR is for one process per rank (under mpirun or torchrun); local "
            "worker threads meet in this process: drop --rendezvous");
      }
      return;
    case LaunchEnv::Kind::kMpi:
      if (options.backend == Backend::kGloo && options.rendezvous.empty()) {
        throw InvalidArgument(
            "--backend gloo under mpirun needs --rendezvous DIR (a fresh directory every rank "
            "sees), or drop --backend to use MPI");
      }
      break;
    case LaunchEnv::Kind::kTorchrun:
      if (options.backend == Backend::kMpi) {
        throw InvalidArgument(detail::concat(
            "--backend mpi needs mpirun, but this process was started by ", env.description(),
            "; drop --backend (Gloo) or start under `mpirun -np N`"));
      }
      break;
  }
  if (options.workers > 0 && options.workers != env.world_size) {
    throw InvalidArgument(detail::concat("--workers ", options.workers, " but ", env.description(),
                                         " started ", env.world_size,
                                         " processes (one worker each); drop --workers"));
  }
}

Connection connect(const LaunchEnv& env, const ConnectOptions& options) {
  check_launch(env, options);
  Connection out;
  out.env = env;
  switch (env.kind) {
    case LaunchEnv::Kind::kLocal: {
      const int workers = options.workers > 0 ? options.workers : kDefaultLocalWorkers;
      out.ranks = connect_gloo_local(workers, options.gloo);
      out.how = detail::concat(workers, " local threads, gloo");
      return out;
    }
    case LaunchEnv::Kind::kMpi:
      if (options.backend == Backend::kGloo) {
        out.ranks.push_back(
            connect_gloo_file(options.rendezvous, env.rank, env.world_size, options.gloo));
        out.how = "mpirun, gloo through directory " + options.rendezvous;
      } else {
        out.ranks.push_back(connect_mpi(options.gloo.timeout));
        out.how = "mpirun, mpi";
      }
      return out;
    case LaunchEnv::Kind::kTorchrun:
      if (!options.rendezvous.empty()) {
        out.ranks.push_back(
            connect_gloo_file(options.rendezvous, env.rank, env.world_size, options.gloo));
        out.how = env.description() + ", gloo through directory " + options.rendezvous;
      } else {
        out.ranks.push_back(connect_gloo_tcp(env.tcp, env.rank, env.world_size, options.gloo));
        out.how = env.description() + ", gloo";
      }
      return out;
  }
  throw InvalidArgument("unknown launch kind");
}

void run_ranks(Connection& connection, const std::function<void(Communicator&)>& fn) {
  auto& ranks = connection.ranks;
  if (ranks.size() == 1) {
    fn(*ranks[0]);
    return;
  }
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(*ranks[i]);
      } catch (...) {
        errors[i] = std::current_exception();
        ranks[i].reset();  // closes its connections: the peers learn now, not at their timeout
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void run_local(int world_size, const GlooOptions& options,
               const std::function<void(Communicator&)>& fn) {
  Connection connection;
  connection.ranks = connect_gloo_local(world_size, options);
  run_ranks(connection, fn);
}

#if !DGC_WITH_MPI
bool have_mpi() { return false; }

std::unique_ptr<Communicator> connect_mpi(Timeout) {
  throw CommError("this build of dgc has no MPI backend (configured with DGC_WITH_MPI=OFF)");
}
#endif

}  // namespace dgc::comm
