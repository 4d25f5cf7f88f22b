// Small POSIX socket helpers for the TCP store's server and client: name resolution, socket
// options and waiting on a deadline. Every failure a caller could handle is a CommError.
#pragma once

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <string>

namespace dgc::comm::tcp {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string errno_text(int err);

// "host:port", for messages.
std::string endpoint(const std::string& host, int port);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// Time left until the deadline, never negative.
milliseconds remaining(Clock::time_point deadline);

// Waits for `events` on fd until the deadline. Returns false on timeout.
bool poll_until(int fd, short events, Clock::time_point deadline);

// The numeric host of an address ("" if it has none).
std::string numeric_address(const sockaddr* addr, socklen_t len);

// getaddrinfo's list, freed with its owner.
struct AddrInfo {
  addrinfo* list = nullptr;
  AddrInfo() = default;
  AddrInfo(const AddrInfo&) = delete;
  AddrInfo& operator=(const AddrInfo&) = delete;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

// Resolves host:port for a stream socket; an unknown host is a CommError naming MASTER_ADDR.
void resolve(const std::string& host, int port, AddrInfo& out);

}  // namespace dgc::comm::tcp
