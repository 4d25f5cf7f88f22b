// The stores the Gloo rendezvous (gloo_rendezvous.cc) runs over, one entry point each: the
// in-process store of connect_gloo_local, a shared directory, and TCP (dgc's own TcpStore, or
// libtorch's c10d::TCPStore once use_c10d_store() has set the connector).
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>

#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "dgc/comm/gloo_communicator.h"
#include "dgc/comm/gloo_errors.h"
#include "dgc/comm/gloo_rendezvous.h"
#include "dgc/comm/launch.h"
#include "dgc/comm/tcp_store.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

using Rendezvous = GlooRendezvous;

// The in-process store of run_local, with a presence check that does not wait.
class LocalStore final : public gloo::rendezvous::HashStore {
 public:
  bool has(const std::string& k) {
    std::lock_guard lock(m_);
    return map_.count(k) != 0;
  }
};

// Gloo's FileStore, with its presence check made public.
class DirectoryStore final : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::string& k) { return check({k}); }
};

// Set by use_c10d_store() (dgc::comm_torch); null: dgc's own TcpStore.
TcpConnector tcp_connector = nullptr;

}  // namespace

std::vector<std::unique_ptr<Communicator>> connect_gloo_local(int world_size,
                                                              const GlooOptions& options) {
  DGC_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  LocalStore store;
  Rendezvous rv{store, [&store](const std::string& k) { return store.has(k); },
                "the in-process store"};
  std::vector<std::unique_ptr<Communicator>> comms(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        // The data connections bind to options.hostname, else the loopback address.
        comms[r] = connect_gloo_rendezvous(rv, r, world_size, options, "127.0.0.1");
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return comms;
}

std::unique_ptr<Communicator> connect_gloo_file(const std::string& directory, int rank,
                                                int world_size, const GlooOptions& options) {
  DGC_CHECK(!directory.empty(), "rendezvous directory must not be empty");
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    throw CommError(
        detail::concat("rendezvous: cannot create directory '", directory, "': ", ec.message()));
  }
  auto store =
      with_gloo_errors(detail::concat("rendezvous: cannot use directory '", directory, "'"),
                       [&] { return std::make_unique<DirectoryStore>(directory); });
  Rendezvous rv{*store, [&store](const std::string& k) { return store->has(k); },
                detail::concat("directory '", directory, "'")};
  return connect_gloo_rendezvous(rv, rank, world_size, options, /*local_address=*/"");
}

void set_tcp_connector(TcpConnector connect) { tcp_connector = connect; }

bool have_c10d_store() { return tcp_connector != nullptr; }

std::unique_ptr<Communicator> connect_gloo_tcp(const TcpRendezvous& where, int rank, int world_size,
                                               const GlooOptions& options) {
  DGC_CHECK(!where.master_addr.empty(), "MASTER_ADDR must not be empty");
  if (tcp_connector) return tcp_connector(where, rank, world_size, options);
  if (where.agent_store) {
    throw CommError(
        "this process uses dgc's own TCP store, which cannot join the store of torchrun's "
        "agent (TORCHELASTIC_USE_AGENT_STORE=True); libtorch's store comes with "
        "dgc::comm_torch (use_c10d_store(), as the dgc program of a build with libtorch "
        "does): use that, or start the ranks with the four variables and no agent (rank 0 "
        "serves)");
  }
  TcpStore store(where.master_addr, where.master_port, rank, world_size, options.timeout);
  Rendezvous rv{store, [&store](const std::string& k) { return store.check({k}); },
                detail::concat("the TCP store at ", where.master_addr, ":", where.master_port)};
  std::unique_ptr<Communicator> comm;
  try {
    comm = connect_gloo_rendezvous(rv, rank, world_size, options, store.local_address());
  } catch (const MismatchError&) {
    store.linger_after_refusal(options.timeout);
    throw;
  }
  store.close(options.timeout);
  return comm;
}

}  // namespace dgc::comm
