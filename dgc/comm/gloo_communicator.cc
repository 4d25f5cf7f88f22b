// The Gloo backend: rendezvous over a key-value store (in-process, shared directory or TCP), then
// Gloo's TCP transport and its collectives (ring allgatherv, tree broadcast, direct
// alltoall/alltoallv), and a ring allreduce of our own over Gloo's unbound buffers.
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
#include <gloo/allgatherv.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/types.h>
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
#include "dgc/comm/gloo_rendezvous.h"
#include "dgc/comm/launch.h"
#include "dgc/comm/tcp_store.h"
#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"
#include "dgc/core/key_value.h"

namespace dgc::comm {
namespace {

using Rendezvous = GlooRendezvous;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Gloo throws three unrelated types; turn any of them into a CommError with context.
template <typename F>
auto with_gloo_errors(const std::string& what, F&& body) {
  try {
    return body();
  } catch (const gloo::IoException& e) {
    throw CommError(what + ": " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    throw CommError(what + ": " + e.what());
  } catch (const gloo::Exception& e) {
    throw CommError(what + ": " + e.what());
  }
}

std::string key(const char* what, int rank) { return detail::concat("dgc.", what, ".", rank); }

std::vector<char> to_chars(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_chars(const std::vector<char>& v) { return {v.begin(), v.end()}; }

std::string this_host() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// The in-process store of run_local, with a presence check that does not wait.
class LocalStore final : public gloo::rendezvous::HashStore {
 public:
  bool has(const std::string& k) {
    std::lock_guard lock(m_);
    return map_.count(k) != 0;
  }
};

// Gloo's FileStore, with its presence check made public.
class DirectoryStore final : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::string& k) { return check({k}); }
};

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
      with_gloo_errors(detail::concat("rendezvous through ", rv.description),
                       [&] {
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
      throw TimeoutError(detail::concat(
          "rendezvous through ", rv.description, ": rank(s) ", rank_list(absent), " of ",
          world_size, " did not ",
          std::strcmp(what, "join") == 0    ? "join"
          : std::strcmp(what, "done") == 0 ? "finish rendezvous"
                                            : "finish connecting",
          " within ", timeout.count(), " ms; are all ", world_size,
          " processes running, with the same world size and rendezvous settings?"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(20));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context, Timeout default_timeout,
                   std::map<std::string, int> peer_by_address, std::vector<std::string> hosts)
      : Communicator(default_timeout),
        context_(std::move(context)),
        peer_by_address_(std::move(peer_by_address)),
        hosts_(std::move(hosts)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::string backend() const override { return "gloo"; }

 protected:
  std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call& call) override {
    std::vector<uint64_t> sizes(size(), 0);
    sizes[rank()] = mine;
    run(call, gloo::allgatherv, [&](auto& opts) {
      opts.setOutput(sizes.data(), std::vector<size_t>(size(), 1));  // own entry primed in place
    });
    return sizes;
  }

  void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                          const Call& call) override {
    run(call, gloo::allgatherv, [&](auto& opts) {
      opts.setOutput(flat.data(), std::vector<size_t>(sizes.begin(), sizes.end()));
    });
  }

  std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t> send, const Call& call) override {
    std::vector<uint64_t> in(send.begin(), send.end()), out(size(), 0);
    run(call, gloo::alltoall, [&](auto& opts) {
      opts.setInput(in.data(), in.size());
      opts.setOutput(out.data(), out.size());
    });
    return out;
  }

  void alltoallv_payload(std::span<const uint8_t> send, std::span<const uint64_t> send_sizes,
                         std::span<uint8_t> receive, std::span<const uint64_t> receive_sizes,
                         const Call& call) override {
    const std::vector<int64_t> send_counts(send_sizes.begin(), send_sizes.end());
    const std::vector<int64_t> receive_counts(receive_sizes.begin(), receive_sizes.end());
    run(call, gloo::alltoallv, [&](auto& opts) {
      // Gloo's options take non-const pointers; it only reads the input.
      opts.setInput(const_cast<uint8_t*>(send.data()), send_counts);
      opts.setOutput(receive.data(), receive_counts);
    });
  }

  // A ring allreduce (reduce-scatter, then allgather) driven here over Gloo's unbound buffers
  // rather than by gloo::allreduce, which keeps a scratch buffer of its own that it destroys
  // inside libgloo when a peer fails, before this class can close the connections (see
  // run_guarded). The same algorithm as Gloo's ring: each rank's chunk is cut into segments of at
  // most 1 MiB, at least two, so that one segment travels while another is reduced. Rank r
  // receives from r-1 and sends to r+1.
  void allreduce_sum_primitive(std::span<float> values, const Call& call) override {
    const int n = size();
    const size_t count = values.size();
    constexpr size_t kMaxSegmentElements = (size_t{1} << 20) / sizeof(float);
    const auto ceil_div = [](size_t a, size_t b) { return (a + b - 1) / b; };
    const size_t per_chunk = std::max<size_t>(2, ceil_div(ceil_div(count, kMaxSegmentElements), n));
    const size_t segment = ceil_div(count, per_chunk * n);  // elements; the last ones may be short
    // Segment i of a phase: step s = i / per_chunk of the ring, segment j = i % per_chunk of
    // chunk c (modulo n), as bytes of `values` (empty past the end).
    const auto piece = [&](int c, size_t i) {
      const size_t chunk = static_cast<size_t>((c % n + n) % n);
      const size_t start = std::min(count, (chunk * per_chunk + i % per_chunk) * segment);
      const size_t end = std::min(count, start + segment);
      return Piece{start * sizeof(float), (end - start) * sizeof(float)};
    };
    const auto step = [&](size_t i) { return static_cast<int>(i / per_chunk); };
    const size_t steps = static_cast<size_t>(n - 1) * per_chunk;
    const uint64_t slot = gloo::Slot::build(gloo::kAllreduceSlotPrefix, next_tag());
    std::vector<float> incoming(2 * segment);  // two segments in flight
    // Declared before run_guarded: they outlive the connections on an error.
    auto out = context_->createUnboundBuffer(values.data(), values.size_bytes());
    auto in = context_->createUnboundBuffer(incoming.data(), incoming.size() * sizeof(float));
    run_guarded(call, [&] {
      // Reduce-scatter: at step s this rank sends chunk rank - s and adds what it receives into
      // chunk rank - s - 1; after n - 1 steps chunk rank + 1 holds the sum over every rank.
      ring_phase(
          *out, *in, steps, call, slot, [&](size_t i) { return piece(rank() - step(i), i); },
          [&](size_t i) { return piece(rank() - step(i) - 1, i); },
          [&](size_t i) { return (i % 2) * segment * sizeof(float); },
          [&](size_t i, const Piece& received) {
            float* sum = values.data() + received.offset / sizeof(float);
            const float* add = incoming.data() + (i % 2) * segment;
            for (size_t j = 0, m = received.bytes / sizeof(float); j < m; ++j) sum[j] += add[j];
          });
      // Allgather: at step s this rank sends the complete chunk rank + 1 - s and receives the
      // complete chunk rank - s in place.
      ring_phase(
          *out, *out, steps, call, slot, [&](size_t i) { return piece(rank() + 1 - step(i), i); },
          [&](size_t i) { return piece(rank() - step(i), i); },
          [&](size_t i) { return piece(rank() - step(i), i).offset; }, [](size_t, const Piece&) {});
    });
  }

  void broadcast_primitive(std::span<uint8_t> data, int root, const Call& call) override {
    run(call, gloo::broadcast, [&](auto& opts) {
      opts.setOutput(data.data(), data.size());
      opts.setRoot(root);
    });
  }

  void barrier_primitive(const Call& call) override {
    run(call, gloo::barrier, [](auto&) {});
  }

  // Peers blocked on this rank learn at once instead of at their own timeout.
  void on_failure() override { close_connections(); }

 private:
  uint32_t next_tag() { return tag_++; }

  void close_connections() noexcept {
    try {
      context_->closeConnections();
    } catch (...) {
      // Best effort: the connections may already be gone.
    }
  }

  // Bytes [offset, offset + bytes) of a buffer.
  struct Piece {
    size_t offset = 0;
    size_t bytes = 0;
  };

  // One phase of the ring allreduce, two segments in flight each way: step i sends sent(i) of
  // `out` to rank + 1 and receives received(i) from rank - 1 into `in` at landing(i); landed(i,
  // received(i)) runs once it is there, before step i + 2 is started. Empty pieces do not
  // travel (both ends compute the same sizes). Send i may carry what step i - 2 or earlier
  // landed.
  template <typename Sent, typename Received, typename Landing, typename Landed>
  void ring_phase(gloo::transport::UnboundBuffer& out, gloo::transport::UnboundBuffer& in,
                  size_t steps, const Call& call, uint64_t slot, Sent&& sent, Received&& received,
                  Landing&& landing, Landed&& landed) {
    const int next = (rank() + 1) % size();
    const int prev = (rank() + size() - 1) % size();
    for (size_t i = 0; i < steps + 2; ++i) {
      if (i >= 2) {
        if (const Piece done = received(i - 2); done.bytes > 0) {
          in.waitRecv(call.remaining());
          landed(i - 2, done);
        }
        if (sent(i - 2).bytes > 0) out.waitSend(call.remaining());
      }
      if (i < steps) {
        if (const Piece coming = received(i); coming.bytes > 0) {
          in.recv(prev, slot, landing(i), coming.bytes);
        }
        if (const Piece going = sent(i); going.bytes > 0) {
          out.send(next, slot, going.offset, going.bytes);
        }
      }
    }
  }

  // Runs one of Gloo's collectives on options built here: `setup` gives them their buffers, the
  // tag and the deadline are set here. The options own the collective's unbound buffers, so they
  // are declared outside run_guarded and outlive the connections when it fails.
  template <typename Options, typename Setup>
  void run(const Call& call, void (*collective)(Options&), Setup&& setup) {
    Options opts(context_);
    run_guarded(call, [&] {
      setup(opts);
      opts.setTag(next_tag());
      opts.setTimeout(call.remaining());
      collective(opts);
    });
  }

  // The lifetime rule of Gloo's TCP transport on an error. A failed collective can leave
  // operations pending on its unbound buffers: a send still completing to a live peer while the
  // dead peer's pair failed, or an error being signalled to every pending buffer. Gloo's I/O
  // thread touches a buffer only under the lock of the pair the operation is on; closing every
  // pair (gloo::Context::closeConnections: each pair's lock, then a tick of the event loop)
  // therefore orders each of those touches before this thread goes on, and after it none can
  // come. So on any error in `body` this closes every connection before it throws, and only
  // then does the unwinding destroy the buffers: every unbound buffer `body` uses, and the
  // memory under it, must be declared before the call to run_guarded.
  template <typename F>
  void run_guarded(const Call& call, F&& body) {
    try {
      body();
    } catch (const gloo::IoException& e) {
      fail(call, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      fail(call, e.what());
    } catch (const gloo::Exception& e) {
      fail(call, e.what());
    } catch (...) {
      close_connections();
      throw;
    }
  }

  // Gloo's messages name the peer by address ("... [127.0.0.1]:41235"); say which rank it is.
  std::string describe_peer(const std::string& message) const {
    for (const auto& [address, peer] : peer_by_address_) {
      if (message.find(address) != std::string::npos) {
        return detail::concat("peer rank ", peer, " (", hosts_[peer], ", ", address, ")");
      }
    }
    return {};
  }

  // Gloo's timeout message says "recv" or "send" but not with whom. In the ring algorithms
  // that is a fixed neighbour (which may itself be waiting on its own neighbour).
  std::string ring_neighbour(const std::string& op, const std::string& gloo_message) const {
    const bool recv = gloo_message.find("recv operation") != std::string::npos;
    const bool send = gloo_message.find("send operation") != std::string::npos;
    if (!recv && !send) return {};
    const int next = (rank() + 1) % size();
    const int prev = (rank() + size() - 1) % size();
    int peer = -1;
    // Both ring collectives receive from r-1 and send to r+1.
    if (op.rfind("allgatherv", 0) == 0 || op == "allreduce") peer = recv ? prev : next;
    if (peer < 0) return {};
    return detail::concat("; this rank was waiting to ", recv ? "receive from" : "send to",
                          " rank ", peer, " (", hosts_[peer],
                          "), which may itself be waiting on another rank");
  }

  // Closes the connections (the lifetime rule above) and throws Gloo's error as a CommError
  // (TimeoutError when it timed out) that names the peer's rank where Gloo named its address.
  [[noreturn]] void fail(const Call& call, const std::string& gloo_message) {
    close_connections();
    const std::string op = call.op;
    const auto elapsed =
        std::chrono::duration_cast<milliseconds>(Clock::now() - call.start).count();
    const bool timed_out = gloo_message.find("Timed out") != std::string::npos ||
                           gloo_message.find("imeout") != std::string::npos;
    const std::string peer = describe_peer(gloo_message);
    std::string what;
    if (timed_out) {
      what = detail::concat("gloo ", op, " timed out on rank ", rank(), " of ", size(), " after ",
                            elapsed, " ms (timeout ", call.timeout.count(),
                            " ms): a peer stalled or died",
                            peer.empty() ? ring_neighbour(op, gloo_message) : "; waiting for " + peer);
    } else {
      const bool closed = gloo_message.find("closed") != std::string::npos ||
                          gloo_message.find("reset") != std::string::npos ||
                          gloo_message.find("Broken pipe") != std::string::npos;
      what = detail::concat("gloo ", op, " failed on rank ", rank(), " of ", size(), " after ",
                            elapsed, " ms: ",
                            peer.empty() ? std::string("a peer connection failed")
                                         : (closed ? peer + " closed the connection (it died, "
                                                            "exited or gave up on an error)"
                                                   : "error on the connection to " + peer));
    }
    what += " [gloo: " + gloo_message + "]";
    if (timed_out) throw TimeoutError(what);
    throw CommError(what);
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::map<std::string, int> peer_by_address_;
  std::vector<std::string> hosts_;
  uint32_t tag_ = 0;
};

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
          rv.store.set(key("join", rank), to_chars(detail::concat("world_size=", world_size,
                                                                  "\nhost=", host,
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
            throw MismatchError(detail::concat(
                "world size mismatch at rendezvous through ", rv.description, ": ",
                r < rank ? them : me, " but ", r < rank ? me : them,
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
  with_gloo_errors(detail::concat("rendezvous through ", rv.description, ": rank ", rank,
                                  " cannot register"),
                   [&] { rv.store.set(key("done", rank), to_chars("1")); });
  if (rv.serving) wait_for_all(rv, "done", world_size, timeout, [](int, const std::string&) {});
  return std::make_unique<GlooCommunicator>(std::move(context), timeout, std::move(peer_by_address),
                                            std::move(hosts));
}

std::string resolve_hostname(const GlooOptions& options) {
  return options.hostname.empty() ? this_host() : options.hostname;
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> connect_gloo_local(int world_size,
                                                                      const GlooOptions& options) {
  DGC_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  LocalStore store;
  Rendezvous rv{store, [&store](const std::string& k) { return store.has(k); },
                "the in-process store"};
  const std::string hostname = options.hostname.empty() ? "127.0.0.1" : options.hostname;
  std::vector<std::unique_ptr<Communicator>> comms(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[r] = connect_gloo(rv, r, world_size, hostname, options.timeout,
                                options.rendezvous_key);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return comms;
}

std::unique_ptr<Communicator> connect_gloo_file(const std::string& directory, int rank,
                                                int world_size, const GlooOptions& options) {
  DGC_CHECK(!directory.empty(), "rendezvous directory must not be empty");
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    throw CommError(
        detail::concat("rendezvous: cannot create directory '", directory, "': ", ec.message()));
  }
  auto store =
      with_gloo_errors(detail::concat("rendezvous: cannot use directory '", directory, "'"),
                       [&] { return std::make_unique<DirectoryStore>(directory); });
  Rendezvous rv{*store, [&store](const std::string& k) { return store->has(k); },
                detail::concat("directory '", directory, "'")};
  return connect_gloo(rv, rank, world_size, resolve_hostname(options), options.timeout,
                      options.rendezvous_key);
}

namespace {
// Set by use_c10d_store() (dgc::comm_torch); null: dgc's own TcpStore.
TcpConnector tcp_connector = nullptr;
}  // namespace

void set_tcp_connector(TcpConnector connect) { tcp_connector = connect; }

bool have_c10d_store() { return tcp_connector != nullptr; }

std::unique_ptr<Communicator> connect_gloo_rendezvous(const GlooRendezvous& rv, int rank,
                                                      int world_size, const GlooOptions& options,
                                                      const std::string& local_address) {
  const std::string hostname = !options.hostname.empty() ? options.hostname
                               : !local_address.empty()  ? local_address
                                                         : this_host();
  return connect_gloo(rv, rank, world_size, hostname, options.timeout, options.rendezvous_key);
}

std::unique_ptr<Communicator> connect_gloo_tcp(const TcpRendezvous& where, int rank,
                                               int world_size, const GlooOptions& options) {
  DGC_CHECK(!where.master_addr.empty(), "MASTER_ADDR must not be empty");
  if (tcp_connector) return tcp_connector(where, rank, world_size, options);
  if (where.agent_store) {
    throw CommError(
        "this process uses dgc's own TCP store, which cannot join the store of torchrun's "
        "agent (TORCHELASTIC_USE_AGENT_STORE=True); libtorch's store comes with "
        "dgc::comm_torch (use_c10d_store(), as the dgc program of a build with libtorch "
        "does): use that, or start the ranks with the four variables and no agent (rank 0 "
        "serves)");
  }
  TcpStore store(where.master_addr, where.master_port, rank, world_size, options.timeout);
  Rendezvous rv{store, [&store](const std::string& k) { return store.check({k}); },
                detail::concat("the TCP store at ", where.master_addr, ":", where.master_port)};
  std::unique_ptr<Communicator> comm;
  try {
    comm = connect_gloo_rendezvous(rv, rank, world_size, options, store.local_address());
  } catch (const MismatchError&) {
    store.linger_after_refusal(options.timeout);
    throw;
  }
  store.close(options.timeout);
  return comm;
}

}  // namespace dgc::comm
