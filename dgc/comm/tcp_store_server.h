// The TCP store's server (rank 0 of a TcpStore): one thread, poll() over the listening socket, a
// wake-up pipe and the clients; the requests themselves are TcpStoreService's. Private to the
// TCP store: TcpStore owns one on rank 0.
//
// The constructor binds host:port (a CommError says why it cannot) and starts the thread; the
// destructor stops it.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/comm/tcp_store_service.h"

namespace dgc::comm {

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, int world_size);

  ~TcpStoreServer();

  // Stops the thread and closes every socket. Idempotent.
  void stop();

  // TcpStoreService::linger_after_refusal / wait_for_byes, from any thread.
  void linger_after_refusal(Timeout timeout);
  bool wait_for_byes(int count, Timeout timeout);

 private:
  struct Client {
    int fd = -1;
    TcpStoreService::Connection connection;
    size_t out_pos = 0;
  };

  // The server thread: poll() over the wake-up pipe, the listening socket and the clients.
  void loop();
  void accept_clients();
  void read_client(Client& c);
  void write_client(Client& c);

  int world_size_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  TcpStoreService service_;
  std::thread thread_;
  std::vector<Client> clients_;  // owned by the server thread
};

}  // namespace dgc::comm
