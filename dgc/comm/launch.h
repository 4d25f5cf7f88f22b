// Creating communicators: the backends and the rendezvous users know, and the one function that
// turns the launch environment into communicators (connect()).
//
//   local:    N worker threads in this process, Gloo over loopback TCP, in-process store.
//   file:     Gloo, ranks meet through a shared directory (any process, any host on a shared fs).
//   torchrun: Gloo, MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, meeting in a TCP key-value store:
//             under torchrun's static rendezvous its agent serves a c10d::TCPStore there
//             (TORCHELASTIC_USE_AGENT_STORE=True) and every rank is a client; otherwise (the four
//             variables from a script, a scheduler, `torchrun --standalone`) rank 0 serves it.
//   mpi:      Open MPI, under `mpirun -np N`; rank and size come from MPI.
//
// The store: in builds with libtorch (DGC_WITH_TORCH) libtorch's c10d::TCPStore, the one torchrun
// and PyTorch use; in builds without it dgc's own TcpStore (tcp_store.h), which serves the same
// four-variable convention but cannot be a client of torchrun's agent.
//
// Process-wide effect: Gloo writes to sockets with writev(), which raises SIGPIPE when a peer has
// died. So that the survivors get a dgc::CommError instead of being killed, the first Gloo
// communicator sets SIGPIPE to SIG_IGN if it is at its default; a handler the program installed
// is left alone.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/auth.h"

namespace dgc::comm {

enum class Backend : uint8_t { kGloo, kMpi };
Backend parse_backend(const std::string& name);  // "gloo" | "mpi"; throws dgc::InvalidArgument
std::string to_string(Backend backend);

// Local worker threads when neither the command line nor a launcher says how many.
inline constexpr int kDefaultLocalWorkers = 4;

struct GlooOptions {
  // Address Gloo's TCP transport binds to for data connections. Empty: derived from the
  // rendezvous (loopback for local runs, the address that routes to MASTER_ADDR for TCP
  // rendezvous, this host's name for a shared directory).
  std::string hostname;
  // Timeout for rendezvous (waiting for all ranks to appear) and the default for collectives.
  Timeout timeout = kDefaultTimeout;
  // The job's rendezvous key (JobKeys::rendezvous, dgc/core/auth.h) when the job has a secret:
  // every value this rank writes to the rendezvous store is tagged and every value it reads is
  // verified (authenticated_store.h); a value without a valid tag (a stranger, or a rank given
  // another secret) stops this rank with a dgc::AuthenticationError naming the key. Gloo's data
  // connections themselves stay plain TCP (docs/reliability.md).
  std::optional<MacKey> rendezvous_key;
};

// Where the TCP rendezvous store is and who serves it.
struct TcpRendezvous {
  std::string master_addr;
  int master_port = 0;
  // torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a
  // client. Otherwise rank 0 serves it on master_port (all interfaces) for the rendezvous only.
  bool agent_store = false;
  // Prefix of every key this run writes (as c10d's PrefixStore joins it: prefix + "/" + key), so
  // that a run never reads the agent's keys or those of an earlier attempt of a restarted run.
  std::string key_prefix = "dgc";
};

// The launch environment, read from the process environment once, at start-up, by the front end
// (never deep inside the library).
struct LaunchEnv {
  enum class Kind : uint8_t { kLocal, kMpi, kTorchrun } kind = Kind::kLocal;
  int rank = 0;
  int world_size = 1;
  TcpRendezvous tcp;  // kTorchrun only

  // torchrun's agent started this process (TORCHELASTIC_RUN_ID is set).
  bool torchrun_agent = false;
  std::string run_id;     // TORCHELASTIC_RUN_ID
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  int group_rank = -1;    // GROUP_RANK: this node's index among torchrun's nodes (-1: not set)
  // Processes of this run on this host and this one's index among them: LOCAL_WORLD_SIZE and
  // LOCAL_RANK (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE/_RANK (Open MPI); 0 and -1 when not set.
  int local_world_size = 0;
  int local_rank = -1;
  int omp_num_threads = 0;  // OMP_NUM_THREADS (torchrun sets 1 unless the user did); 0: not set

  // "local threads", "mpirun", "torchrun (agent store at 127.0.0.1:29500)", "MASTER_ADDR/
  // MASTER_PORT (rank 0 serves the store at 127.0.0.1:29500)", ...: for logs and messages.
  std::string description() const;
};

// torchrun when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set (the agent's store when
// TORCHELASTIC_USE_AGENT_STORE=True, which then needs TORCHELASTIC_RESTART_COUNT too); mpi when
// Open MPI's OMPI_COMM_WORLD_RANK/SIZE (or PMI_RANK/PMI_SIZE) are set; local otherwise. Also reads
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT,
// OMPI_COMM_WORLD_LOCAL_RANK/SIZE and OMP_NUM_THREADS. Inconsistent, partial or malformed
// variables throw dgc::InvalidArgument naming the variable.
LaunchEnv detect_launch();

// How a command wants to connect; the command line maps onto it one to one.
struct ConnectOptions {
  std::optional<Backend> backend;  // empty: mpi under mpirun, gloo otherwise
  // Local worker threads; under a launcher the world size is the launcher's and this must be 0
  // (not given) or equal to it. 0 without a launcher: kDefaultLocalWorkers.
  int workers = 0;
  // Gloo under a launcher: meet in this shared directory instead of the TCP store (the only
  // Gloo rendezvous under mpirun). Empty: the TCP store under torchrun.
  std::string rendezvous;
  GlooOptions gloo;
};

// Worker processes or threads of this run on this host: `workers` (or kDefaultLocalWorkers) for
// local threads, else LOCAL_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE, else 1.
int local_workers(const LaunchEnv& env, int workers);

// Intra-op threads each worker should use so that the workers of one host share its cores:
// OMP_NUM_THREADS when set (torchrun sets it to 1 unless the user did), else
// max(1, hardware threads / local_workers(env, workers)).
int threads_per_worker(const LaunchEnv& env, int workers);

// Checks the options against the launch (before anything connects), with the same messages for
// every command: --backend mpi outside mpirun, --workers that differ from the launcher's world
// size, --rendezvous without a launcher, Gloo under mpirun without --rendezvous. Throws
// dgc::InvalidArgument saying what to do.
void check_launch(const LaunchEnv& env, const ConnectOptions& options);

// The communicators of this process: `workers` of them (local threads, all created together in
// threads of their own since rendezvous is collective) or one (under a launcher). Calls
// check_launch first.
struct Connection {
  LaunchEnv env;
  std::vector<std::unique_ptr<Communicator>> ranks;  // index = position in this process
  std::string how;  // e.g. "torchrun (agent store at 127.0.0.1:29500), gloo"
};
Connection connect(const LaunchEnv& env, const ConnectOptions& options);

// Runs fn(comm) on every rank of the connection: on this thread when there is one, on one thread
// each otherwise, all joined before returning. A rank whose fn throws has its communicator
// destroyed at once (its peers get a CommError instead of waiting for the timeout); the first
// exception by rank is rethrown after all threads end.
void run_ranks(Connection& connection, const std::function<void(Communicator&)>& fn);

// Runs fn(comm) on `world_size` threads, each with its own Gloo communicator, all joined before
// returning (connect() + run_ranks() for local threads).
void run_local(int world_size, const GlooOptions& options,
               const std::function<void(Communicator&)>& fn);

// `world_size` Gloo communicators over an in-process store (ranks as threads of this process),
// connected on one thread each; index = rank. Use them from one thread each (run_ranks()).
std::vector<std::unique_ptr<Communicator>> connect_gloo_local(int world_size,
                                                              const GlooOptions& options);

// Gloo with rendezvous through a shared directory (created if missing).
std::unique_ptr<Communicator> connect_gloo_file(const std::string& directory, int rank,
                                                int world_size, const GlooOptions& options);

// Gloo with rendezvous through the TCP store described by `where`.
std::unique_ptr<Communicator> connect_gloo_tcp(const TcpRendezvous& where, int rank, int world_size,
                                               const GlooOptions& options);

// Open MPI. Initialises MPI on first use (MPI_THREAD_MULTIPLE not required) and finalises at
// exit. Throws dgc::CommError if dgc was built without MPI or if not launched by mpirun.
std::unique_ptr<Communicator> connect_mpi(Timeout timeout = kDefaultTimeout);

// True if this build has the MPI backend.
bool have_mpi();

// True if the TCP rendezvous uses libtorch's c10d::TCPStore (and so can join torchrun's agent
// store); false in builds without libtorch, which use dgc's TcpStore.
bool have_c10d_store();

}  // namespace dgc::comm
