// TCP key-value store for rendezvous: the client every rank runs (tcp_store.h). Rank 0 also
// runs the server (tcp_store_server.h); the wire protocol is in tcp_store_wire.h.
#include "dgc/comm/tcp_store.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "dgc/comm/tcp_socket.h"
#include "dgc/comm/tcp_store_server.h"
#include "dgc/comm/tcp_store_service.h"
#include "dgc/comm/tcp_store_wire.h"
#include "dgc/core/error.h"

namespace dgc::comm {

using namespace tcp;
using namespace tcp_store_wire;

namespace {
constexpr size_t kMaxKeyBytes = TcpStoreService::kMaxKeyBytes;
constexpr size_t kMaxValueBytes = TcpStoreService::kMaxValueBytes;
constexpr size_t kMaxFrameBytes = TcpStoreService::kMaxFrameBytes;
constexpr size_t kMaxCheckKeys = TcpStoreService::kMaxCheckKeys;
}  // namespace

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
