#include "dgc/comm/tcp_socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dgc/core/error.h"

namespace dgc::comm::tcp {

std::string errno_text(int err) { return std::strerror(err); }

std::string endpoint(const std::string& host, int port) { return detail::concat(host, ":", port); }

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return std::max(left, milliseconds(0));
}

bool poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = remaining(deadline);
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the read/write report the error
    if (Clock::now() >= deadline) return false;
  }
}

std::string numeric_address(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = {0};
  if (getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return host;
}

void resolve(const std::string& host, int port, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out.list);
  if (rc != 0) {
    throw CommError(
        detail::concat("rendezvous: cannot resolve MASTER_ADDR '", host, "': ", gai_strerror(rc)));
  }
}

}  // namespace dgc::comm::tcp
