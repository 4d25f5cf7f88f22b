// Creating communicators: the backends and the rendezvous users know.
//
//   local:    N worker threads in this process, Gloo over loopback TCP, in-process store.
//   file:     Gloo, ranks meet through a shared directory (any process, any host on a shared fs).
//   torchrun: Gloo, MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE; rank 0 serves the key-value store
//             over TCP (as torchrun's TCPStore does), the others connect to it.
//   mpi:      Open MPI, under `mpirun -np N`; rank and size come from MPI.
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

#include "dgc/comm/communicator.h"

namespace dgc::comm {

enum class Backend : uint8_t { kGloo, kMpi };
Backend parse_backend(const std::string& name);  // "gloo" | "mpi"; throws dgc::InvalidArgument
std::string to_string(Backend backend);

struct GlooOptions {
  // Address Gloo's TCP transport binds to for data connections. Empty: derived from the
  // rendezvous (loopback for local runs, this host's name otherwise).
  std::string hostname;
  // Timeout for rendezvous (waiting for all ranks to appear) and the default for collectives.
  Timeout timeout = kDefaultTimeout;
};

// The launch environment detected from the process environment. Read once, at start-up, by the
// front end only (never deep inside the library).
struct LaunchEnv {
  enum class Kind : uint8_t { kLocal, kMpi, kTorchrun } kind = Kind::kLocal;
  int rank = 0;
  int world_size = 1;
  std::string master_addr;  // torchrun only
  int master_port = 0;      // torchrun only
};
// torchrun when RANK and WORLD_SIZE (and MASTER_ADDR/MASTER_PORT) are set; mpi when Open MPI's
// OMPI_COMM_WORLD_RANK/SIZE (or PMI_RANK/PMI_SIZE) are set; local otherwise. Inconsistent or
// partial variables throw dgc::InvalidArgument saying which variable is missing or wrong.
LaunchEnv detect_launch();

// Runs fn(comm) on `world_size` threads, each with its own Gloo communicator, all joined before
// returning. If any rank throws, the first exception (by rank) is rethrown after all threads end;
// ranks blocked on the failed one get a CommError within the timeout.
void run_local(int world_size, const GlooOptions& options,
               const std::function<void(Communicator&)>& fn);

// Gloo with rendezvous through a shared directory (created if missing).
std::unique_ptr<Communicator> connect_gloo_file(const std::string& directory, int rank,
                                                int world_size, const GlooOptions& options);

// Gloo with torchrun-style rendezvous: rank 0 serves a TCP key-value store on master_port.
std::unique_ptr<Communicator> connect_gloo_tcp(const std::string& master_addr, int master_port,
                                               int rank, int world_size,
                                               const GlooOptions& options);

// Open MPI. Initialises MPI on first use (MPI_THREAD_MULTIPLE not required) and finalises at
// exit. Throws dgc::CommError if dgc was built without MPI or if not launched by mpirun.
std::unique_ptr<Communicator> connect_mpi(Timeout timeout = kDefaultTimeout);

// True if this build has the MPI backend.
bool have_mpi();

}  // namespace dgc::comm
