// TCP key-value store for rendezvous. Wire protocol (private to this file, little endian):
//   frame   = u32 body_length | body
//   request = u8 op | fields;      reply = u8 status | fields
//   string  = u32 length | bytes
//   HELLO rank i32, world_size i32 -> kOk | kError | kMismatch
//   SET   key, value               -> kOk
//   GET   key                      -> kOk value | kMissing
//   CHECK u32 n, n keys            -> kOk u8 all_present
//   BYE                            -> kOk (the server counts it; the client then disconnects)
#include "dgc/comm/tcp_store.h"
#include "dgc/comm/tcp_store_service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kCheck = 4, kBye = 5 };
enum Status : uint8_t { kOk = 0, kMissing = 1, kError = 2, kMismatch = 3 };

constexpr size_t kMaxKeyBytes = TcpStoreService::kMaxKeyBytes;
constexpr size_t kMaxValueBytes = TcpStoreService::kMaxValueBytes;
constexpr size_t kMaxFrameBytes = TcpStoreService::kMaxFrameBytes;
constexpr size_t kMaxCheckKeys = TcpStoreService::kMaxCheckKeys;

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

// Waits for `events` on fd until the deadline. Returns false on timeout.
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

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

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

}  // namespace

// ------------------------------------------------------------------------------------------------
// Service: the requests, on bytes (tcp_store_service.h).

TcpStoreService::TcpStoreService(std::string where, int world_size)
    : where_(std::move(where)), world_size_(world_size) {}

void TcpStoreService::linger_after_refusal(Timeout timeout) {
  std::unique_lock lock(mutex_);
  if (!refused_) return;
  byes_cv_.wait_for(lock, timeout, [&] {
    return static_cast<int>(told_.size() - told_.count(0)) >= world_size_ - 1;
  });
}

bool TcpStoreService::wait_for_byes(int count, Timeout timeout) {
  std::unique_lock lock(mutex_);
  return byes_cv_.wait_for(lock, timeout, [&] { return byes_ >= count || refused_; });
}

bool TcpStoreService::process_frames(Connection& c) {
  size_t pos = 0;
  while (c.in.size() - pos >= 4) {
    const uint32_t n = load_le<uint32_t>(c.in.data() + pos);
    if (n > kMaxFrameBytes || n == 0) {
      c.dead = true;  // not our protocol, or over the bounds
      return false;
    }
    if (c.in.size() - pos - 4 < n) break;
    handle(c, c.in.data() + pos + 4, n);
    pos += 4 + n;
    if (c.dead) return false;
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  return true;
}

void TcpStoreService::reply(Connection& c, uint8_t status, const std::vector<uint8_t>& fields) {
  ByteWriter(c.out).u32(static_cast<uint32_t>(1 + fields.size())).u8(status).raw(fields);
}

void TcpStoreService::refuse(Connection& c, int rank) {
  std::vector<uint8_t> f;
  ByteWriter(f).string(error_);
  reply(c, kMismatch, f);
  std::lock_guard lock(mutex_);
  told_.insert(rank);
  byes_cv_.notify_all();
}

void TcpStoreService::fail_all(const std::string& message) {
  if (error_.empty()) error_ = message;
  std::lock_guard lock(mutex_);
  refused_ = true;
  byes_cv_.notify_all();
}

void TcpStoreService::handle(Connection& c, const uint8_t* body, size_t size) {
  try {
    ByteReader request({body, size}, "store request");
    handle_request(c, request);
  } catch (const DecodeError&) {
    c.dead = true;  // a truncated or oversized field: not our protocol
  }
}

void TcpStoreService::handle_request(Connection& c, ByteReader& r) {
  const uint8_t op = r.u8("operation");
  if (op == kBye) {
    reply(c, kOk);
    c.close_after_write = true;
    if (c.rank != 0) {
      std::lock_guard lock(mutex_);
      ++byes_;
      byes_cv_.notify_all();
    }
    return;
  }
  if (op == kHello) {
    const auto rank = static_cast<int32_t>(r.u32("rank"));
    const auto world_size = static_cast<int32_t>(r.u32("world size"));
    if (world_size != world_size_) {
      fail_all(detail::concat(
          "world size mismatch: rank ", rank, " was started with WORLD_SIZE=", world_size,
          " but rank 0 (the master at ", where_, ") has WORLD_SIZE=", world_size_,
          "; start every process with the same WORLD_SIZE"));
    } else if (rank < 0 || rank >= world_size_) {
      fail_all(detail::concat("a process connected with RANK=", rank, ", outside [0, ", world_size_,
                              ") for WORLD_SIZE=", world_size_));
    } else if (seen_ranks_.count(rank) != 0) {  // every accepted HELLO is in seen_ranks_
      fail_all(detail::concat("two processes were started with RANK=", rank,
                              "; every process needs its own RANK in [0, ", world_size_, ")"));
    } else {
      c.rank = rank;
      seen_ranks_.insert(rank);
    }
    if (!error_.empty()) {
      refuse(c, rank);
      return;
    }
    reply(c, kOk);
    return;
  }
  if (c.rank < 0) {
    c.dead = true;  // every client introduces itself first
    return;
  }
  if (!error_.empty()) {
    refuse(c, c.rank);
    return;
  }
  switch (op) {
    case kSet: {
      std::string key = r.string(kMaxKeyBytes, "key");
      std::string value = r.string(kMaxValueBytes, "value");
      auto it = data_.find(key);
      const size_t old = it == data_.end() ? 0 : it->first.size() + it->second.size();
      if ((it == data_.end() && data_.size() >= kMaxKeys) ||
          stored_bytes_ - old + key.size() + value.size() > kMaxStoredBytes) {
        std::vector<uint8_t> f;
        ByteWriter(f).string("rendezvous store is full (bounded at 65536 keys, 256 MiB)");
        reply(c, kError, f);
        return;
      }
      stored_bytes_ = stored_bytes_ - old + key.size() + value.size();
      data_[std::move(key)] = std::move(value);
      reply(c, kOk);
      return;
    }
    case kGet: {
      const std::string key = r.string(kMaxKeyBytes, "key");
      auto it = data_.find(key);
      if (it == data_.end()) {
        reply(c, kMissing);
        return;
      }
      std::vector<uint8_t> f;
      ByteWriter(f).string(it->second);
      reply(c, kOk, f);
      return;
    }
    case kCheck: {
      const uint32_t n = r.u32("key count");
      if (n > kMaxCheckKeys) {
        c.dead = true;
        return;
      }
      bool all = true;
      for (uint32_t i = 0; i < n; ++i) {
        const std::string key = r.string(kMaxKeyBytes, "key");
        all = all && data_.count(key) != 0;
      }
      reply(c, kOk, {static_cast<uint8_t>(all ? 1 : 0)});
      return;
    }
    default:
      c.dead = true;
  }
}

// ------------------------------------------------------------------------------------------------
// Server: one thread, poll() over the listening socket, a wake-up pipe and the clients.

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, int world_size)
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

  ~TcpStoreServer() { stop(); }

  void stop() {
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

  void linger_after_refusal(Timeout timeout) { service_.linger_after_refusal(timeout); }
  bool wait_for_byes(int count, Timeout timeout) { return service_.wait_for_byes(count, timeout); }

 private:
  struct Client {
    int fd = -1;
    TcpStoreService::Connection connection;
    size_t out_pos = 0;
  };

  void loop() {
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

  void accept_clients() {
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

  void read_client(Client& c) {
    auto& in = c.connection.in;
    uint8_t buf[65536];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        in.insert(in.end(), buf, buf + n);
        if (in.size() > kMaxFrameBytes + 4 && !service_.process_frames(c.connection)) return;
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

  void write_client(Client& c) {
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

  int world_size_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  TcpStoreService service_;
  std::thread thread_;
  std::vector<Client> clients_;  // owned by the server thread
};

// ------------------------------------------------------------------------------------------------
// Client.

struct TcpStore::Reply {
  uint8_t status = kError;
  std::vector<uint8_t> body;  // after the status byte
};

namespace {
// The one string field of a reply; a malformed reply is a CommError.
std::string reply_string(std::span<const uint8_t> body, uint64_t max_bytes) {
  try {
    return ByteReader(body, "the store's reply").string(max_bytes, "string");
  } catch (const DecodeError& e) {
    throw CommError(detail::concat("rendezvous: ", e.what()));
  }
}
}  // namespace

TcpStore::TcpStore(const std::string& master_addr, int port, int rank, int world_size,
                   Timeout timeout)
    : master_addr_(master_addr),
      port_(port),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout) {
  DGC_CHECK(port > 0 && port < 65536, "MASTER_PORT must be in [1, 65535], got ", port);
  DGC_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  DGC_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  DGC_CHECK(timeout.count() > 0, "rendezvous timeout must be positive");
  if (rank == 0) server_ = std::make_unique<TcpStoreServer>(master_addr, port, world_size);
  try {
    connect_client(timeout);
  } catch (const MismatchError&) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    // Rank 0's own join was refused (another rank's mismatch arrived first): keep serving the
    // refusal so that the ranks still connecting learn why instead of finding no server.
    if (server_) server_->linger_after_refusal(timeout);
    server_.reset();
    throw;
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    server_.reset();
    throw;
  }
}

TcpStore::~TcpStore() {
  try {
    close(milliseconds(100));  // the error path: do not hold up the error for goodbyes
  } catch (...) {
  }
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::connect_client(Timeout timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no address";
  auto pause = milliseconds(20);
  for (;;) {
    AddrInfo addrs;
    resolve(master_addr_, port_, addrs);
    for (addrinfo* a = addrs.list; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = errno_text(errno);
        continue;
      }
      set_nonblocking(fd);
      int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (rc != 0 && err == EINPROGRESS) {
        const auto attempt = std::min(deadline, Clock::now() + std::chrono::seconds(2));
        if (poll_until(fd, POLLOUT, attempt)) {
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
      if (err != 0) {
        last_error = errno_text(err);
        ::close(fd);
        continue;
      }
      set_nodelay(fd);
      fd_ = fd;
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        local_address_ = numeric_address(reinterpret_cast<sockaddr*>(&local), len);
      }
    }
    if (fd_ >= 0) break;
    if (Clock::now() + pause >= deadline) {
      throw TimeoutError(detail::concat(
          "rendezvous: rank ", rank_,
          " could not reach the store at MASTER_ADDR:MASTER_PORT = ", endpoint(master_addr_, port_),
          " within ", timeout.count(), " ms (last error: ", last_error,
          "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same for every "
          "process?"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(500));
  }
  std::vector<uint8_t> body;
  ByteWriter(body).u32(static_cast<uint32_t>(rank_)).u32(static_cast<uint32_t>(world_size_));
  request(kHello, body, remaining(deadline) + milliseconds(1));
}

TcpStore::Reply TcpStore::request(uint8_t op, const std::vector<uint8_t>& body, Timeout timeout) {
  if (fd_ < 0) {
    throw CommError(
        detail::concat("rendezvous: the TCP store connection of rank ", rank_, " is closed"));
  }
  const auto deadline = Clock::now() + timeout;
  auto timed_out = [&](const char* what) {
    return TimeoutError(detail::concat("rendezvous: rank ", rank_, " timed out after ",
                                       timeout.count(), " ms ", what, " the store at ",
                                       endpoint(master_addr_, port_)));
  };
  auto broken = [&](const std::string& why) {
    return CommError(detail::concat("rendezvous: lost the connection to the store at ",
                                    endpoint(master_addr_, port_), " (rank 0): ", why,
                                    "; did rank 0 exit?"));
  };
  std::vector<uint8_t> frame;
  ByteWriter(frame).u32(static_cast<uint32_t>(1 + body.size())).u8(op).raw(body);
  size_t sent = 0;
  while (sent < frame.size()) {
    if (!poll_until(fd_, POLLOUT, deadline)) throw timed_out("sending to");
    const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw broken(errno_text(errno));
    }
  }
  auto read_exact = [&](uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      if (!poll_until(fd_, POLLIN, deadline)) throw timed_out("waiting for a reply from");
      const ssize_t r = ::recv(fd_, out + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0) {
        throw broken("connection closed");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw broken(errno_text(errno));
      }
    }
  };
  uint8_t len_bytes[4];
  read_exact(len_bytes, 4);
  const uint32_t n = load_le<uint32_t>(len_bytes);
  if (n == 0 || n > kMaxFrameBytes) throw broken(detail::concat("bad reply length ", n));
  std::vector<uint8_t> reply_body(n);
  read_exact(reply_body.data(), n);
  Reply reply;
  reply.status = reply_body[0];
  reply.body.assign(reply_body.begin() + 1, reply_body.end());
  if (reply.status == kError || reply.status == kMismatch) {
    const std::string message = reply_string(reply.body, kMaxFrameBytes);
    if (reply.status == kMismatch) throw MismatchError("rendezvous: " + message);
    throw CommError("rendezvous: " + message);
  }
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  DGC_CHECK_LE(key.size(), kMaxKeyBytes, "rendezvous key too long");
  DGC_CHECK_LE(data.size(), kMaxValueBytes, "rendezvous value too large for key ", key);
  std::vector<uint8_t> body;
  ByteWriter(body).string(key).string({data.data(), data.size()});
  request(kSet, body, timeout_);
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<uint8_t> body;
  ByteWriter(body).string(key);
  Reply reply = request(kGet, body, timeout_);
  if (reply.status != kOk) {
    throw CommError(detail::concat("rendezvous: key '", key, "' vanished from the store"));
  }
  const std::string value = reply_string(reply.body, kMaxValueBytes);
  return std::vector<char>(value.begin(), value.end());
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  DGC_CHECK_LE(keys.size(), kMaxCheckKeys, "too many keys in one check");
  std::vector<uint8_t> body;
  ByteWriter writer(body);
  writer.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) writer.string(k);
  Reply reply = request(kCheck, body, timeout_);
  return !reply.body.empty() && reply.body[0] == 1;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  // Gloo passes 0 (kNoTimeout) for "no timeout"; this store never waits unbounded.
  const Timeout limit = timeout.count() > 0 ? timeout : timeout_;
  const auto deadline = Clock::now() + limit;
  auto pause = milliseconds(2);
  for (;;) {
    if (check(keys)) return;
    if (Clock::now() >= deadline) {
      std::ostringstream names;
      for (size_t i = 0; i < keys.size(); ++i) names << (i ? ", " : "") << keys[i];
      throw TimeoutError(detail::concat("rendezvous: rank ", rank_, " timed out after ",
                                        limit.count(), " ms waiting for key(s) [", names.str(),
                                        "] in the store at ", endpoint(master_addr_, port_)));
    }
    std::this_thread::sleep_for(std::min(pause, remaining(deadline) + milliseconds(1)));
    pause = std::min(pause * 2, milliseconds(50));
  }
}

void TcpStore::linger_after_refusal(Timeout timeout) {
  if (server_) server_->linger_after_refusal(timeout);
}

void TcpStore::close(Timeout timeout) {
  if (closed_) return;
  closed_ = true;
  if (fd_ >= 0) {
    try {
      request(kBye, {}, std::min(timeout, timeout_));
    } catch (const Error&) {
      // The store is going away either way; rendezvous already succeeded or failed.
    }
    ::close(fd_);
    fd_ = -1;
  }
  if (server_) {
    server_->wait_for_byes(world_size_ - 1, timeout);
    server_->stop();
    server_.reset();
  }
}

}  // namespace dgc::comm
