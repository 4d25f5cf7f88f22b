// Gloo's rendezvous::Store over libtorch's c10d::TCPStore: the store torchrun's agent serves and
// PyTorch's workers use. In dgc::comm_torch, built only with libtorch (DGC_WITH_TORCH); the c10d
// headers stay in c10d_store.cc. dgc::comm itself does not link libtorch (a process that loads
// libtorch pays about a second of start-up): a program opts in with use_c10d_store().
//
// Contract:
//   - `serve`: this process binds MASTER_PORT (all interfaces) and serves the store until the
//     object is destroyed; otherwise it is a client (of rank 0, or of torchrun's agent).
//   - Every key is written and read under TcpRendezvous::key_prefix, joined as c10d's
//     PrefixStore joins it ("prefix/key").
//   - Every call is bounded by the timeout given at construction (wait() by its argument).
//     libtorch's errors (c10::Error, c10d::TimeoutError, std::runtime_error) become
//     dgc::CommError / dgc::TimeoutError that say what happened and what to do, with libtorch's
//     own message kept at the end in [c10d: ...].
//   - A client retries connecting about once a second and gives up when less than a second of
//     the timeout is left (c10d's rule), so it fails within the timeout.
//   - Thread-safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "dgc/comm/launch.h"

namespace dgc::comm {

// From now on connect_gloo_tcp() (and so connect() under torchrun or MASTER_ADDR/MASTER_PORT)
// meets in libtorch's c10d::TCPStore, and can join the store of torchrun's agent; without this
// call it uses dgc's own TcpStore. Call it before any rank connects (main() of the dgc program
// does).
void use_c10d_store();

class C10dStore final : public gloo::rendezvous::Store {
 public:
  C10dStore(const TcpRendezvous& where, bool serve, int rank, int world_size, Timeout timeout);
  ~C10dStore() override;

  C10dStore(const C10dStore&) = delete;
  C10dStore& operator=(const C10dStore&) = delete;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key (up to the timeout), then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // True if every key is present now (no waiting).
  bool check(const std::vector<std::string>& keys);
  // Atomically adds `delta` to the integer at `key` (0 if absent); returns the new value.
  int64_t add(const std::string& key, int64_t delta);

  // This host's address on the route to MASTER_ADDR (numeric), e.g. "127.0.0.1"; empty if it
  // cannot be found. Used to choose the interface the data connections bind to.
  const std::string& local_address() const { return local_address_; }

  // "torchrun's agent store at A:P" or "the store rank 0 serves at A:P", for messages.
  const std::string& description() const { return description_; }

 private:
  struct Impl;
  template <typename F>
  auto call(const char* op, F&& body);

  std::unique_ptr<Impl> impl_;
  TcpRendezvous where_;
  int rank_;
  Timeout timeout_;
  std::string local_address_;
  std::string description_;
};

}  // namespace dgc::comm
