// The Gloo backend's collectives over a connected gloo::rendezvous::Context: Gloo's ring
// allgatherv, direct alltoall/alltoallv and tree broadcast, and a ring allreduce of our own over
// Gloo's unbound buffers (see allreduce_sum_primitive). The rendezvous that connects the context
// is in gloo_rendezvous.cc.
#include "dgc/comm/gloo_communicator.h"

#include <gloo/allgatherv.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>

#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

using std::chrono::milliseconds;

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

  void alltoallv_payload(std::span<const uint8_t> send, std::span<const uint64_t> send_offsets,
                         std::span<const uint64_t> send_sizes, std::span<uint8_t> receive,
                         std::span<const uint64_t> receive_sizes, const Call& call) override {
    const std::vector<int64_t> send_counts(send_sizes.begin(), send_sizes.end());
    const std::vector<int64_t> receive_counts(receive_sizes.begin(), receive_sizes.end());
    std::vector<uint8_t> storage;  // gloo::alltoallv takes the messages back to back only
    const auto input = packed(send, send_offsets, send_sizes, storage);
    run(call, gloo::alltoallv, [&](auto& opts) {
      // Gloo's options take non-const pointers; it only reads the input.
      opts.setInput(const_cast<uint8_t*>(input.data()), send_counts);
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
      what = detail::concat(
          "gloo ", op, " timed out on rank ", rank(), " of ", size(), " after ", elapsed,
          " ms (timeout ", call.timeout.count(), " ms): a peer stalled or died",
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

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(
    std::shared_ptr<gloo::rendezvous::Context> context, Timeout default_timeout,
    std::map<std::string, int> peer_by_address, std::vector<std::string> hosts) {
  return std::make_unique<GlooCommunicator>(std::move(context), default_timeout,
                                            std::move(peer_by_address), std::move(hosts));
}

}  // namespace dgc::comm
