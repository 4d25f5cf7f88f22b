// Gloo's rendezvous through a key-value store, for the stores that live outside
// gloo_stores.cc: libtorch's c10d::TCPStore (dgc::comm_torch, c10d_store.cc) joins here, so
// that dgc::comm itself does not link libtorch. For dgc's own libraries; installed with the other
// headers, like c10d_store.h it needs gloo's headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <gloo/rendezvous/store.h>

#include "dgc/comm/communicator.h"
#include "dgc/comm/launch.h"

namespace dgc::comm {

// What connecting needs from a store, beyond gloo's set/get/wait.
struct GlooRendezvous {
  gloo::rendezvous::Store& store;
  // True if the key is present now (no waiting).
  std::function<bool(const std::string&)> has;
  // For messages: "the TCP store at A:P", "torchrun's agent store at A:P", ...
  std::string description;
  // Atomic add (returns the new value), where the store has one; empty otherwise.
  std::function<int64_t(const std::string&, int64_t)> add = {};
  // This process serves the store: it must outlive every other rank's use of it.
  bool serving = false;
};

// Claims `rank`, joins, and connects the full mesh of Gloo pairs (the steps at the top of
// gloo_rendezvous.cc). The data connections bind to options.hostname, else `local_address`
// (the store's route to MASTER_ADDR), else this host's name.
std::unique_ptr<Communicator> connect_gloo_rendezvous(const GlooRendezvous& rv, int rank,
                                                      int world_size, const GlooOptions& options,
                                                      const std::string& local_address);

// Makes connect_gloo_tcp() use `connect` instead of dgc's own TcpStore (see use_c10d_store() in
// c10d_store.h). Not thread-safe with connect_gloo_tcp(): call it before any rank connects.
using TcpConnector = std::unique_ptr<Communicator> (*)(const TcpRendezvous& where, int rank,
                                                       int world_size, const GlooOptions& options);
void set_tcp_connector(TcpConnector connect);

}  // namespace dgc::comm
