// A key-value store over TCP for torchrun-style rendezvous (MASTER_ADDR, MASTER_PORT): rank 0
// serves it from a thread of its own process, as torchrun's TCPStore does; every rank (rank 0
// included) talks to it as a client over one TCP connection.
//
// It carries only rendezvous data (Gloo's pair addresses and dgc's join/ready keys); the
// collectives never touch it.
//
// Contract:
//   - Every request is bounded by a deadline; nothing blocks forever. Failures throw
//     dgc::CommError, dgc::TimeoutError (deadline passed) or dgc::MismatchError (the server
//     refused this rank: world size differs from rank 0's, rank out of range, rank taken).
//   - The server refuses a rank whose world size differs from its own, a rank out of range and a
//     second process claiming a rank already connected; it then fails every later request from
//     every client with that message, so the whole group stops, not only the offender.
//   - Bounded: keys up to 4 KiB, values up to 1 MiB, 65536 keys, 256 MiB in all, and at most
//     2 * world_size + 8 simultaneous connections.
//   - Rank 0's constructor fails at once, with a message naming MASTER_PORT, when the port is
//     taken; other ranks retry connecting until the timeout, then say the master is unreachable.
//   - Thread-safety: one thread at a time per TcpStore (the server thread is internal).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "dgc/comm/communicator.h"

namespace dgc::comm {

class TcpStoreServer;

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Rank 0 binds master_addr:port (an address of this host) and starts the server; every rank
  // then connects to it, retrying until `timeout`. `timeout` is also the default for wait().
  TcpStore(const std::string& master_addr, int port, int rank, int world_size, Timeout timeout);
  ~TcpStore() override;

  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key (up to the default timeout), then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // True if every key is present now (no waiting).
  bool check(const std::vector<std::string>& keys);

  // This host's address on the connection to the master (numeric), e.g. "127.0.0.1". Used to
  // choose the interface the data connections bind to.
  const std::string& local_address() const { return local_address_; }

  // Rank 0, after the server refused a rank: keeps serving the refusal until every other rank
  // has been told (or `timeout` passes), so that no rank is left waiting for a master that is
  // gone. No-op elsewhere and when nothing was refused.
  void linger_after_refusal(Timeout timeout);

  // Ends rendezvous. Clients say goodbye and disconnect; rank 0 also waits (up to `timeout`) for
  // every other rank's goodbye, then stops the server and frees the port. Idempotent; the
  // destructor calls it with a 100 ms timeout.
  void close(Timeout timeout);

 private:
  struct Reply;
  Reply request(uint8_t op, const std::vector<uint8_t>& body, Timeout timeout);
  void connect_client(Timeout timeout);

  std::string master_addr_;
  int port_;
  int rank_;
  int world_size_;
  Timeout timeout_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  int fd_ = -1;
  std::string local_address_;
  bool closed_ = false;
};

}  // namespace dgc::comm
