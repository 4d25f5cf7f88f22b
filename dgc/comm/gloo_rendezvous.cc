// The Gloo backend's rendezvous over a key-value store (in-process, shared directory or TCP):
// every rank meets the others, then Gloo's TCP transport connects the full mesh and
// make_gloo_communicator (gloo_communicator.h) runs the collectives over it. The stores, one entry
// point each, are in gloo_stores.cc.
//
// Rendezvous, on every rank, all through the store:
//   0. claim: with a store that counts (c10d's add), add 1 to "dgc.claim.<rank>"; a count over 1
//             means two processes were given the same rank;
//   1. join:  set "dgc.join.<rank>" = world size, host, pid; wait until every rank has joined
//             and check that all agree on the world size (a rank missing at the deadline, or a
//             different world size, is named in the error). A rank that finds a mismatch (or a
//             claimed rank) publishes it as "dgc.abort" and every rank waiting to join throws the
//             same MismatchError; a rank that serves the store keeps serving until every other
//             rank has acknowledged it ("dgc.abort_seen.<rank>") or the timeout passes. Under a
//             job secret, a value without a valid tag (another secret) is an AuthenticationError,
//             published the same way: each rank then finds the tag of the abort invalid in turn;
//   2. connect: gloo::rendezvous::Context::connectFullMesh over a "gloo" prefix of the store;
//   3. ready: set "dgc.ready.<rank>" = this rank's local address for each peer connection, wait
//             for every rank's. Gloo's errors name a peer by the remote address of a socket;
//             that address is mapped to the rank from the peers' ready keys, this process's own
//             sockets (/proc/self/fd) and Gloo's published pair addresses, so errors name ranks.
//   4. done:  set "dgc.done.<rank>"; the rank that serves the store (rank 0 without torchrun's
//             agent) waits for every rank's before it stops serving.
// After step 4 nobody reads the store again; the TCP store is closed there.
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "dgc/comm/authenticated_store.h"
#include "dgc/comm/gloo_communicator.h"
#include "dgc/comm/gloo_errors.h"
#include "dgc/comm/gloo_rendezvous.h"
#include "dgc/comm/launch.h"
#include "dgc/comm/tcp_store.h"
#include "dgc/core/error.h"
#include "dgc/core/key_value.h"

namespace dgc::comm {
namespace {

using Rendezvous = GlooRendezvous;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string key(const char* what, int rank) { return detail::concat("dgc.", what, ".", rank); }

std::vector<char> to_chars(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_chars(const std::vector<char>& v) { return {v.begin(), v.end()}; }

std::string this_host() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// A store plus a non-blocking presence check, and a description for error messages.
constexpr const char* kAbortKey = "dgc.abort";

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// Local address -> remote address of every TCP socket of this process, as Gloo prints them.
// Diagnostics only: a socket that vanishes while we look is skipped.
std::map<std::string, std::string> tcp_sockets() noexcept try {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage local{}, remote{};
    socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (local.ss_family != AF_INET && local.ss_family != AF_INET6) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0) continue;
    try {
      out[gloo::transport::tcp::Address(local).str()] = gloo::transport::tcp::Address(remote).str();
    } catch (...) {
      // Not an address Gloo can print; not one of Gloo's sockets either.
    }
  }
  return out;
} catch (...) {
  return {};  // no /proc, or it changed under us: errors then name addresses only
}

// Waits until every rank's `what` key is present; calls on_value(rank, value) once per rank as
// soon as its key appears. Throws TimeoutError naming the missing ranks at the deadline.
// With `abortable`, a published "dgc.abort" ends the wait with its MismatchError.
void wait_for_all(const Rendezvous& rv, const char* what, int world_size, Timeout timeout,
                  const std::function<void(int, const std::string&)>& on_value,
                  bool abortable = false) {
  const auto deadline = Clock::now() + timeout;
  std::vector<bool> seen(world_size, false);
  int missing = world_size;
  auto pause = milliseconds(1);
  for (;;) {
    if (abortable) {
      std::optional<std::string> abort;
      with_gloo_errors(detail::concat("rendezvous through ", rv.description), [&] {
        if (rv.has(kAbortKey)) abort = from_chars(rv.store.get(kAbortKey));
      });
      if (abort) throw MismatchError(*abort);
    }
    for (int r = 0; r < world_size; ++r) {
      if (seen[r]) continue;
      std::optional<std::string> value;
      with_gloo_errors(
          detail::concat("rendezvous through ", rv.description, ": reading rank ", r, "'s key"),
          [&] {
            if (rv.has(key(what, r))) value = from_chars(rv.store.get(key(what, r)));
          });
      if (!value) continue;
      on_value(r, *value);
      seen[r] = true;
      --missing;
    }
    if (missing == 0) return;
    if (Clock::now() >= deadline) {
      std::vector<int> absent;
      for (int r = 0; r < world_size; ++r) {
        if (!seen[r]) absent.push_back(r);
      }
      throw TimeoutError(
          detail::concat("rendezvous through ", rv.description, ": rank(s) ", rank_list(absent),
                         " of ", world_size, " did not ",
                         std::strcmp(what, "join") == 0   ? "join"
                         : std::strcmp(what, "done") == 0 ? "finish rendezvous"
                                                          : "finish connecting",
                         " within ", timeout.count(), " ms; are all ", world_size,
                         " processes running, with the same world size and rendezvous settings?"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(20));
  }
}

// Gloo writes with writev(), which raises SIGPIPE when the peer has died; at the default
// disposition that kills the survivor instead of letting it report the error. Ignore SIGPIPE
// unless the program installed a handler of its own.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
  });
}

// Tells every rank that the rendezvous failed (the first message wins), acknowledges, and if this
// process serves the store, keeps serving until every other rank has acknowledged or the timeout
// passes. Best effort: the store may be gone; the caller throws its error either way.
void abort_rendezvous(const Rendezvous& rv, int rank, int world_size, Timeout timeout,
                      const std::string& message) {
  try {
    if (!rv.has(kAbortKey)) rv.store.set(kAbortKey, to_chars(message));
    rv.store.set(key("abort_seen", rank), to_chars("1"));
    if (!rv.serving) return;
    const auto deadline = Clock::now() + timeout;
    for (int r = 0; r < world_size && Clock::now() < deadline;) {
      if (r == rank || rv.has(key("abort_seen", r))) {
        ++r;
      } else {
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
  } catch (...) {
    // The caller throws its error either way.
  }
}

std::unique_ptr<Communicator> connect_gloo(const Rendezvous& plain, int rank, int world_size,
                                           const std::string& hostname, Timeout timeout,
                                           const std::optional<MacKey>& rendezvous_key) {
  // With a job secret every value goes through the tagging decorator, Gloo's included.
  std::optional<AuthenticatedStore> authenticated;
  const Rendezvous rv =
      rendezvous_key
          ? Rendezvous{authenticated.emplace(plain.store, *rendezvous_key, plain.description),
                       plain.has, plain.description, plain.add, plain.serving}
          : plain;
  DGC_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  ignore_sigpipe();
  DGC_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  DGC_CHECK(timeout.count() > 0, "timeout must be positive");

  // 0-1. Claim and join; a mismatch found by any rank stops every rank (see the top).
  const std::string host = this_host();
  std::vector<std::string> hosts(world_size);
  try {
    if (rv.add) {
      const int64_t claims = with_gloo_errors(detail::concat("rendezvous through ", rv.description,
                                                             ": rank ", rank, " cannot register"),
                                              [&] { return rv.add(key("claim", rank), 1); });
      if (claims > 1) {
        throw MismatchError(detail::concat(
            "rendezvous through ", rv.description, ": two processes were started with RANK=", rank,
            " (one is host ", host, " pid ", getpid(),
            "); give every process its own RANK, or another MASTER_PORT to a second run"));
      }
    }
    with_gloo_errors(
        detail::concat("rendezvous through ", rv.description, ": rank ", rank,
                       " cannot register; the store already holds this rank's key (from an "
                       "earlier run?): give every run a fresh, empty rendezvous directory"),
        [&] {
          rv.store.set(key("join", rank),
                       to_chars(detail::concat("world_size=", world_size, "\nhost=", host,
                                               "\npid=", getpid(), "\n")));
        });
    wait_for_all(
        rv, "join", world_size, timeout,
        [&](int r, const std::string& value) {
          auto fields = parse_key_value_lines(value);
          const std::string theirs = fields["world_size"];
          if (theirs != std::to_string(world_size)) {
            // Named in rank order, so that every rank that finds it says the same.
            const std::string me = detail::concat("rank ", rank, " (host ", host, ", pid ",
                                                  getpid(), ") with WORLD_SIZE=", world_size);
            const std::string them = detail::concat("rank ", r, " (host ", fields["host"], ", pid ",
                                                    fields["pid"], ") with WORLD_SIZE=", theirs);
            throw MismatchError(detail::concat("world size mismatch at rendezvous through ",
                                               rv.description, ": ", r < rank ? them : me, " but ",
                                               r < rank ? me : them,
                                               "; start every process with the same world size"));
          }
          hosts[r] = detail::concat("host ", fields["host"], " pid ", fields["pid"]);
        },
        /*abortable=*/true);
  } catch (const MismatchError& e) {
    abort_rendezvous(rv, rank, world_size, timeout, e.what());
    throw;
  } catch (const AuthenticationError& e) {
    // Another job secret: the other ranks cannot read this rank's abort message either (its tag
    // is under this rank's key), which tells each of them the same; this rank, if it serves the
    // store, waits until they have.
    abort_rendezvous(rv, rank, world_size, timeout, e.what());
    throw;
  }

  // 2. Connect.
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
  context->setTimeout(timeout);
  with_gloo_errors(detail::concat("rank ", rank, ": connecting the Gloo TCP transport (hostname '",
                                  hostname, "') through ", rv.description, " failed"),
                   [&] {
                     gloo::transport::tcp::attr attr;
                     attr.hostname = hostname;
                     auto device = gloo::transport::tcp::CreateDevice(attr);
                     gloo::rendezvous::PrefixStore gloo_store("gloo", rv.store);
                     context->connectFullMesh(gloo_store, device);
                   });

  // 3. Ready: publish this rank's side of each connection, learn the peers' sides. Gloo names a
  // peer by the remote address of the socket ("[127.0.0.1]:41235"). Where this rank accepted
  // the connection, that is the peer's ephemeral port: find it on our own socket whose local
  // address is the pair's. Where this rank connected, it is the peer's listening address, which
  // the peer publishes here.
  const auto sockets = tcp_sockets();
  std::map<std::string, int> peer_by_address;
  std::ostringstream mine;
  mine << "rank=" << rank << "\n";  // never empty: Gloo's FileStore refuses empty values
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    const std::string self = context->getPair(r)->address().str();
    mine << r << "=" << self << "\n";
    if (auto it = sockets.find(self); it != sockets.end()) peer_by_address[it->second] = r;
  }
  // Gloo's own rendezvous data: every rank's listening address for each of its pairs (Gloo keeps
  // that as the peer's name on some connections). Key and layout are Gloo's: the key is the
  // rank, the value its pairs' addresses in rank order, itself skipped.
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    try {
      gloo::rendezvous::PrefixStore gloo_store("gloo", rv.store);
      const auto all = gloo_store.get(std::to_string(r));
      const size_t each = all.size() / static_cast<size_t>(world_size - 1);
      const size_t index = static_cast<size_t>(rank < r ? rank : rank - 1);
      if (each > 0 && all.size() % each == 0) {
        const std::vector<char> bytes(all.begin() + index * each, all.begin() + (index + 1) * each);
        peer_by_address.emplace(gloo::transport::tcp::Address(bytes).str(), r);
      }
    } catch (...) {
      // Diagnostics only.
    }
  }
  with_gloo_errors(
      detail::concat("rendezvous through ", rv.description, ": rank ", rank, " cannot register"),
      [&] { rv.store.set(key("ready", rank), to_chars(mine.str())); });
  wait_for_all(rv, "ready", world_size, timeout, [&](int r, const std::string& value) {
    if (r == rank) return;
    auto fields = parse_key_value_lines(value);
    auto it = fields.find(std::to_string(rank));
    if (it != fields.end()) peer_by_address[it->second] = r;
  });

  // 4. Done: the rank serving the store waits until nobody reads it any more.
  with_gloo_errors(
      detail::concat("rendezvous through ", rv.description, ": rank ", rank, " cannot register"),
      [&] { rv.store.set(key("done", rank), to_chars("1")); });
  if (rv.serving) wait_for_all(rv, "done", world_size, timeout, [](int, const std::string&) {});
  return make_gloo_communicator(std::move(context), timeout, std::move(peer_by_address),
                                std::move(hosts));
}

}  // namespace

std::unique_ptr<Communicator> connect_gloo_rendezvous(const GlooRendezvous& rv, int rank,
                                                      int world_size, const GlooOptions& options,
                                                      const std::string& local_address) {
  const std::string hostname = !options.hostname.empty() ? options.hostname
                               : !local_address.empty()  ? local_address
                                                         : this_host();
  return connect_gloo(rv, rank, world_size, hostname, options.timeout, options.rendezvous_key);
}

}  // namespace dgc::comm
