#include "dgc/comm/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "dgc/comm/tcp_socket.h"
#include "dgc/core/error.h"

namespace dgc::comm {

using namespace tcp;

TcpStoreServer::TcpStoreServer(const std::string& host, int port, int world_size)
    : world_size_(world_size), service_(endpoint(host, port), world_size) {
  AddrInfo addrs;
  resolve(host, port, addrs);
  std::string not_here;
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EADDRINUSE) {
        throw CommError(detail::concat(
            "rendezvous: MASTER_PORT ", port, " on ", host,
            " is already in use (another run, or a process still holding it); rank 0 serves "
            "the rendezvous store there, so choose a free MASTER_PORT"));
      }
      not_here = errno_text(err);
      continue;
    }
    if (::listen(fd, 128) != 0) {
      const int err = errno;
      ::close(fd);
      throw CommError(detail::concat("rendezvous: listen on ", endpoint(host, port),
                                     " failed: ", errno_text(err)));
    }
    listen_fd_ = fd;
    break;
  }
  if (listen_fd_ < 0) {
    throw CommError(detail::concat(
        "rendezvous: rank 0 cannot bind ", endpoint(host, port), " (", not_here,
        "); rank 0 serves the rendezvous store, so it must run on the host MASTER_ADDR names"));
  }
  set_nonblocking(listen_fd_);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    throw CommError(detail::concat("rendezvous: pipe failed: ", errno_text(errno)));
  }
  thread_ = std::thread([this] { loop(); });
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  const char c = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &c, 1);
  thread_.join();
  for (auto& client : clients_) ::close(client.fd);
  clients_.clear();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TcpStoreServer::linger_after_refusal(Timeout timeout) {
  service_.linger_after_refusal(timeout);
}

bool TcpStoreServer::wait_for_byes(int count, Timeout timeout) {
  return service_.wait_for_byes(count, timeout);
}

void TcpStoreServer::loop() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : clients_) {
      short events = POLLIN;
      if (c.out_pos < c.connection.out.size()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
    }
    const int rc = ::poll(fds.data(), fds.size(), 200);
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0) continue;
    if (fds[0].revents) break;  // stop() woke us
    if (fds[1].revents & POLLIN) accept_clients();
    for (size_t i = 0; i < clients_.size() && i + 2 < fds.size(); ++i) {
      Client& c = clients_[i];
      const short re = fds[i + 2].revents;
      if (re & (POLLIN | POLLHUP | POLLERR)) read_client(c);
      if (!c.connection.dead && (re & POLLOUT)) write_client(c);
    }
    for (auto& c : clients_) {
      if (c.connection.dead) ::close(c.fd);
    }
    std::erase_if(clients_, [](const Client& c) { return c.connection.dead; });
  }
}

void TcpStoreServer::accept_clients() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (clients_.size() >= static_cast<size_t>(2 * world_size_ + 8)) {
      ::close(fd);  // bounded: more connections than any run of this size needs
      continue;
    }
    set_nodelay(fd);
    Client c;
    c.fd = fd;
    clients_.push_back(std::move(c));
  }
}

void TcpStoreServer::read_client(Client& c) {
  auto& in = c.connection.in;
  uint8_t buf[65536];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      in.insert(in.end(), buf, buf + n);
      if (in.size() > TcpStoreService::kMaxFrameBytes + 4 && !service_.process_frames(c.connection))
        return;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      c.connection.dead = true;
      return;
    }
    if (errno == EINTR) continue;
    break;
  }
  service_.process_frames(c.connection);
  if (!c.connection.dead) write_client(c);
}

void TcpStoreServer::write_client(Client& c) {
  auto& out = c.connection.out;
  while (c.out_pos < out.size()) {
    const ssize_t n = ::send(c.fd, out.data() + c.out_pos, out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.connection.dead = true;
    return;
  }
  out.clear();
  c.out_pos = 0;
  if (c.connection.close_after_write) c.connection.dead = true;
}

}  // namespace dgc::comm
