// The request handling of the TCP store's server (tcp_store.h) without sockets: the server feeds
// it the bytes each connection received and sends back what it queues. Kept apart from the
// socket loop so that the request parser runs on bytes alone in the tests and under the fuzzer
// (fuzz/tcp_store_fuzz.cc). Built with dgc::comm only where the TCP store is (without libtorch).
//
// Every request is a frame (u32 body length | body) from an untrusted peer: a frame longer than
// kMaxFrameBytes, an empty frame, an unknown operation, a field that runs past its frame or over
// its bound, and any request before HELLO drop the connection (Connection::dead); nothing a
// client sends can make the service read or allocate past those bounds.
//
// Thread-safety: process_frames only from one thread (the server's); linger_after_refusal and
// wait_for_byes from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/bytes.h"

namespace dgc::comm {

class TcpStoreService {
 public:
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxValueBytes = size_t{1} << 20;
  static constexpr size_t kMaxKeys = 65536;
  static constexpr size_t kMaxStoredBytes = size_t{256} << 20;
  static constexpr size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;
  static constexpr size_t kMaxCheckKeys = 4096;

  // One client connection's protocol state.
  struct Connection {
    int rank = -1;                   // set by a HELLO the service accepted
    std::vector<uint8_t> in;         // received, not yet handled (an incomplete frame at most)
    std::vector<uint8_t> out;        // replies to send
    bool close_after_write = false;  // after BYE: close once `out` is sent
    bool dead = false;               // drop the connection now
  };

  // `where` names the store in messages ("host:port").
  TcpStoreService(std::string where, int world_size);

  // Handles every complete frame in c.in (erasing them; an incomplete frame stays), appending
  // the replies to c.out. Returns false if the connection is to be dropped (c.dead).
  bool process_frames(Connection& c);

  // See TcpStoreServer: wait until every rank but 0 was told of a refusal / `count` clients said
  // goodbye (or a rank was refused), or the timeout passes.
  void linger_after_refusal(Timeout timeout);
  bool wait_for_byes(int count, Timeout timeout);

  size_t stored_bytes() const { return stored_bytes_; }
  size_t key_count() const { return data_.size(); }

 private:
  // One request frame; a malformed one (truncated, a field over its bound) marks the
  // connection dead.
  void handle(Connection& c, const uint8_t* body, size_t size);
  void handle_request(Connection& c, ByteReader& request);
  void reply(Connection& c, uint8_t status, const std::vector<uint8_t>& fields = {});
  void refuse(Connection& c, int rank);
  void fail_all(const std::string& message);

  std::string where_;
  int world_size_;
  // Owned by the thread that calls process_frames.
  std::map<std::string, std::string> data_;
  size_t stored_bytes_ = 0;
  std::set<int> seen_ranks_;
  std::string error_;
  // Shared with the waiting functions.
  std::mutex mutex_;
  std::condition_variable byes_cv_;
  int byes_ = 0;
  bool refused_ = false;
  std::set<int> told_;  // ranks that received the refusal
};

}  // namespace dgc::comm
