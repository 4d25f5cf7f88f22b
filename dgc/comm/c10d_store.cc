#include "dgc/comm/c10d_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "dgc/comm/gloo_rendezvous.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

std::vector<uint8_t> to_bytes(const std::vector<char>& v) { return {v.begin(), v.end()}; }
std::vector<char> to_chars(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

struct Addresses {
  addrinfo* list = nullptr;
  ~Addresses() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

// The numeric address this host uses to reach host:port (a UDP "connection" sends nothing).
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  Addresses addrs;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addrs.list) != 0) return {};
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    const bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    close(fd);
    if (!ok) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    const void* raw =
        local.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    if (inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) return text;
  }
  return {};
}

// False when `host` resolves and none of its addresses belongs to this host (binding one fails
// with EADDRNOTAVAIL). True when it does, or when that cannot be told.
bool is_address_of_this_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  Addresses addrs;
  if (getaddrinfo(host.c_str(), "0", &hints, &addrs.list) != 0) return true;  // c10d will say
  bool any_other_error = false;
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) {
      any_other_error = true;
      continue;
    }
    const int rc = bind(fd, a->ai_addr, a->ai_addrlen);
    const int error = errno;
    close(fd);
    if (rc == 0) return true;
    if (error != EADDRNOTAVAIL) any_other_error = true;
  }
  return any_other_error;
}

using Clock = std::chrono::steady_clock;

// One non-blocking connect to host:port, bounded by `deadline`; "" on success, else the error.
std::string try_connect(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  Addresses addrs;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addrs.list);
  if (rc != 0) return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  std::string error = "no address";
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    int result = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (result == EINPROGRESS) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) == 1) {
        socklen_t length = sizeof(result);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &result, &length);
      } else {
        result = ETIMEDOUT;
      }
    }
    close(fd);
    if (result == 0) return {};
    error = std::strerror(result);
  }
  return error;
}

// c10d's client gives up when less than a second of its timeout is left (and at once below one
// second); so that a client waits for its server the whole timeout, wait here until the port
// answers. Returns "" once it does, else the last error at the deadline.
std::string wait_until_listening(const std::string& host, int port, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    std::string error = try_connect(host, port, deadline);
    if (error.empty() || Clock::now() >= deadline) return error;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(pause, std::max<Clock::duration>(deadline - Clock::now(), {})));
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

}  // namespace

struct C10dStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  c10::intrusive_ptr<c10d::PrefixStore> store;
};

// Runs body(), turning libtorch's errors into dgc's with what to do. c10d reports a timed-out
// request as c10::Error "Socket Timeout", a failed connect as c10d::TimeoutError / SocketError
// (std::runtime_error), a lost server as c10::Error or std::runtime_error.
template <typename F>
auto C10dStore::call(const char* op, F&& body) {
  auto fail = [&](const std::string& message, bool timed_out) -> void {
    const std::string what = detail::concat(
        "rendezvous: rank ", rank_, ": ", op, " on ", description_, " failed: ",
        timed_out ? detail::concat("no answer within ", timeout_.count(), " ms. Is MASTER_PORT ",
                                   where_.master_port,
                                   " held by a program that is not this run's store (another "
                                   "program, or another run)? Choose a free MASTER_PORT and start "
                                   "every rank again")
                  : std::string("the connection to the store failed (did ") +
                        (where_.agent_store ? "the torchrun agent" : "rank 0") +
                        " end, or another rank fail first?)",
        " [c10d: ", message, "]");
    if (timed_out) throw TimeoutError(what);
    throw CommError(what);
  };
  try {
    return body();
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    fail(m, m.find("imeout") != std::string::npos || m.find("timed out") != std::string::npos);
  } catch (const c10d::TimeoutError& e) {
    fail(e.what(), true);
  } catch (const std::exception& e) {
    fail(e.what(), false);
  }
  throw CommError("unreachable");  // fail() always throws
}

C10dStore::C10dStore(const TcpRendezvous& where, bool serve, int rank, int world_size,
                     Timeout timeout)
    : impl_(std::make_unique<Impl>()), where_(where), rank_(rank), timeout_(timeout) {
  const std::string at = detail::concat(where.master_addr, ":", where.master_port);
  description_ =
      where.agent_store ? "torchrun's agent store at " + at : "the store rank 0 serves at " + at;
  if (serve && !is_address_of_this_host(where.master_addr)) {
    throw CommError(detail::concat(
        "rendezvous: rank ", rank, " serves the store, but MASTER_ADDR=", where.master_addr,
        " is not an address of this host; other ranks would look for it there. Run rank 0 on ",
        where.master_addr, ", or set MASTER_ADDR to this host's address on every rank"));
  }
  const std::string remedy =
      where.agent_store
          ? detail::concat("is the torchrun agent of node 0 running, with --master_addr ",
                           where.master_addr, " and --master_port ", where.master_port,
                           ", and reachable from this host? (the agent serves the store; start "
                           "workers through torchrun, not by hand with its variables)")
          : detail::concat("rank 0 serves it: is rank 0 running on ", where.master_addr,
                           " with MASTER_PORT=", where.master_port,
                           ", and can this host reach that address and port?");
  if (!serve) {
    const std::string error =
        wait_until_listening(where.master_addr, where.master_port, Clock::now() + timeout);
    if (!error.empty()) {
      throw TimeoutError(detail::concat(
          "rendezvous: rank ", rank, " could not reach the store at MASTER_ADDR:MASTER_PORT = ", at,
          " within ", timeout.count(), " ms (last error: ", error, "); ", remedy));
    }
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(where.master_port);
  options.isServer = serve;
  options.numWorkers = static_cast<size_t>(world_size);
  // dgc's own join step counts and names the ranks; c10d's "init/" counter is the agent's.
  options.waitWorkers = false;
  // c10d truncates its connect timeout to whole seconds (0 s fails at once).
  options.timeout = std::max<Timeout>(timeout, std::chrono::seconds(1));
  options.multiTenant = false;
  try {
    impl_->tcp = c10::make_intrusive<c10d::TCPStore>(where.master_addr, options);
  } catch (const std::exception& e) {
    std::string m = e.what();
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
      m = c10_error->what_without_backtrace();
    }
    if (serve && m.find("Address already in use") != std::string::npos) {
      throw CommError(detail::concat(
          "rendezvous: MASTER_PORT ", where.master_port, " on ", where.master_addr,
          " is already in use (rank 0 serves the rendezvous store there): another run or another "
          "program holds it. Choose a free MASTER_PORT and start every rank again, or wait for "
          "the other run to end [c10d: ",
          m, "]"));
    }
    const bool timed_out = dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr ||
                           m.find("timed out") != std::string::npos;
    const std::string what =
        detail::concat("rendezvous: rank ", rank, " could not ", serve ? "serve" : "reach",
                       " the store at MASTER_ADDR:MASTER_PORT = ", at,
                       timed_out ? detail::concat(" within ", timeout.count(), " ms") : "", ": ",
                       serve ? "check MASTER_ADDR and MASTER_PORT" : remedy, " [c10d: ", m, "]");
    if (timed_out) throw TimeoutError(what);
    throw CommError(what);
  }
  impl_->store = c10::make_intrusive<c10d::PrefixStore>(where.key_prefix, impl_->tcp);
  // c10d bounds only wait() (and get()) by the timeout; check() and add() would block on a peer
  // that accepts connections but is no store (MASTER_PORT taken by another program). One
  // bounded round trip first tells the two apart.
  const std::string hello = detail::concat("dgc.hello.", rank);
  set(hello, {'1'});
  wait({hello}, timeout);
  local_address_ = local_address_towards(where.master_addr, where.master_port);
}

C10dStore::~C10dStore() = default;

void C10dStore::set(const std::string& key, const std::vector<char>& data) {
  call("set", [&] { impl_->store->set(key, to_bytes(data)); });
}

std::vector<char> C10dStore::get(const std::string& key) {
  return call("get", [&] { return to_chars(impl_->store->get(key)); });
}

void C10dStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void C10dStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  call("wait", [&] { impl_->store->wait(keys, timeout); });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return call("check", [&] { return impl_->store->check(keys); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return call("add", [&] { return impl_->store->add(key, delta); });
}

namespace {

std::unique_ptr<Communicator> connect_gloo_c10d(const TcpRendezvous& where, int rank,
                                                int world_size, const GlooOptions& options) {
  DGC_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  DGC_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  const bool serve = !where.agent_store && rank == 0;
  C10dStore store(where, serve, rank, world_size, options.timeout);
  GlooRendezvous rv{
      store, [&store](const std::string& k) { return store.check({k}); }, store.description(),
      [&store](const std::string& k, int64_t delta) { return store.add(k, delta); }, serve};
  return connect_gloo_rendezvous(rv, rank, world_size, options, store.local_address());
}

}  // namespace

void use_c10d_store() { set_tcp_connector(&connect_gloo_c10d); }

}  // namespace dgc::comm
