// dgc-linkemu: an Ethernet learning switch with per-port delay and loss, for benchmarks on
// emulated wide-area and mobile links where the kernel has no netem.
//
//   dgc-linkemu [--seed S] [--queue-mb M] PORT...     PORT = IFNAME[:DELAY_MS[:LOSS]]
//
// Each PORT is a network interface (in the benchmarks: the switch-side end of a veth pair whose
// other end is a rank's eth0). Frames are read from every port with a packet socket, the source
// MAC is learnt, and each frame is sent out of the port its destination MAC was learnt on (or
// flooded to every other port for broadcast, multicast and unknown destinations) after
//   delay = DELAY_MS(in port) + DELAY_MS(out port)
// and is lost with probability LOSS on the in port and, independently, LOSS on the out port: a
// port's settings describe its link, crossed once on the way in and once on the way out. Two hosts
// on ports with 10 ms and 0.0005 therefore see a 40 ms round trip and about 0.1% loss between
// them. Rate limits are not done here: put tbf on both ends of each veth (the switch side's tbf
// shapes the frames this program sends).
//
// Frames carry the kernel's virtio-net header (PACKET_VNET_HDR), so checksum offload and GSO
// survive forwarding; for a per-packet loss model the benchmark limits GSO to one segment
// (`ip link set dev eth0 gso_max_segs 1`) on the hosts.
//
// Outages: a port can go down for a stated time, as a mobile link does when a phone loses its
// signal: every frame that arrives on it or would leave through it (also one already waiting
// out its delay) is dropped, then the port is restored. Each outage is one of
//   --outage IFNAME:START_S:SECONDS            down START_S seconds after "ready", for SECONDS
//   --random-outages IFNAME:PER_MINUTE:SECONDS outages starting at random (a Poisson process,
//                                              PER_MINUTE a minute on average, drawn from --seed),
//                                              each SECONDS long, never overlapping
//   --signal-outage IFNAME:SECONDS             down for SECONDS each time the process gets SIGUSR1
//                                              (a script takes the link down when the run is at
//                                              the point it wants)
// (each may be given more than once). Each change prints "linkemu: IFNAME down at T s for D s" /
// "linkemu: IFNAME up at T s" (T: seconds since "ready") on stdout at once.
//
// Prints "linkemu: ready ..." on stdout once every port is open; runs until SIGINT or SIGTERM,
// then prints one JSON line of counters (forwarded, lost, queue_drops, send_errors, outages,
// outage_drops) and exits 0.
// Errors (no such interface, no CAP_NET_RAW) exit 1 with a message saying what to do.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// struct virtio_net_hdr (linux/virtio_net.h, which C++ cannot include: a field is named `class`):
// flags, gso_type (u8 each), hdr_len, gso_size, csum_start, csum_offset (u16 each).
constexpr size_t kVnetHeader = 10;

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_outage_signals = 0;
void on_signal(int) { g_stop = 1; }
void on_outage_signal(int) { g_outage_signals = g_outage_signals + 1; }

struct Port {
  std::string name;
  double delay_ms = 0.0;
  double loss = 0.0;
  int fd = -1;
};

// When a port is down: fixed windows, a random process, or on SIGUSR1 (see the file comment).
struct OutageRule {
  enum class Kind { kFixed, kRandom, kSignal } kind = Kind::kFixed;
  std::string port_name;
  int port = -1;
  double start_s = 0.0;     // kFixed
  double per_minute = 0.0;  // kRandom
  double seconds = 0.0;     // length of each outage
};

struct Window {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

struct Pending {
  int64_t release_ns = 0;
  uint64_t seq = 0;
  int port = 0;
  std::vector<uint8_t> frame;  // virtio-net header + Ethernet frame
  bool operator>(const Pending& other) const {
    return release_ns != other.release_ns ? release_ns > other.release_ns : seq > other.seq;
  }
};

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "linkemu: %s\n", message.c_str());
  std::exit(1);
}

double parse_number(const std::string& text, const std::string& what, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(v >= lo && v <= hi)) {
    fail(what + " '" + text + "' must be a number in [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "]");
  }
  return v;
}

Port parse_port(const std::string& spec) {
  Port port;
  const size_t a = spec.find(':');
  port.name = spec.substr(0, a);
  if (port.name.empty() || port.name.size() >= IFNAMSIZ) fail("bad port '" + spec + "'");
  if (a != std::string::npos) {
    const size_t b = spec.find(':', a + 1);
    port.delay_ms = parse_number(spec.substr(a + 1, b == std::string::npos ? b : b - a - 1),
                                 "delay (ms) of " + port.name, 0.0, 10000.0);
    if (b != std::string::npos) {
      port.loss = parse_number(spec.substr(b + 1), "loss of " + port.name, 0.0, 1.0);
    }
  }
  return port;
}

void open_port(Port& port) {
  const unsigned index = if_nametoindex(port.name.c_str());
  if (index == 0) fail("no interface '" + port.name + "' in this network namespace");
  port.fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (port.fd < 0) {
    fail(std::string("packet socket: ") + std::strerror(errno) +
         " (needs CAP_NET_RAW: run as root)");
  }
  const int one = 1;
  if (setsockopt(port.fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0) {
    fail(std::string("PACKET_VNET_HDR: ") + std::strerror(errno));
  }
  // Our own transmissions are not input (Linux 4.20+; the packet type is checked as well).
  (void)setsockopt(port.fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
  sockaddr_ll address{};
  address.sll_family = AF_PACKET;
  address.sll_protocol = htons(ETH_P_ALL);
  address.sll_ifindex = static_cast<int>(index);
  if (bind(port.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    fail("bind to " + port.name + ": " + std::strerror(errno));
  }
  packet_mreq membership{};
  membership.mr_ifindex = static_cast<int>(index);
  membership.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(port.fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &membership, sizeof membership) != 0) {
    fail("promiscuous mode on " + port.name + ": " + std::strerror(errno));
  }
}

// IFNAME:A:B -> the name and two numbers.
OutageRule parse_outage(const std::string& option, const std::string& spec, int numbers) {
  OutageRule rule;
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t colon; (colon = spec.find(':', from)) != std::string::npos; from = colon + 1) {
    parts.push_back(spec.substr(from, colon - from));
  }
  parts.push_back(spec.substr(from));
  if (static_cast<int>(parts.size()) != numbers + 1 || parts[0].empty()) {
    fail(option + " '" + spec + "': expected IFNAME" + (numbers == 2 ? ":A:B" : ":SECONDS") +
         " (see --help)");
  }
  rule.port_name = parts[0];
  rule.seconds = parse_number(parts.back(), option + " seconds", 0.001, 86400.0);
  if (numbers == 2) {
    const double first = parse_number(parts[1], option + " " + parts[0], 0.0, 86400.0);
    if (option == "--outage") {
      rule.kind = OutageRule::Kind::kFixed;
      rule.start_s = first;
    } else {
      rule.kind = OutageRule::Kind::kRandom;
      if (!(first > 0.0)) fail(option + " '" + spec + "': the rate must be above 0 a minute");
      rule.per_minute = first;
    }
  } else {
    rule.kind = OutageRule::Kind::kSignal;
  }
  return rule;
}

uint64_t mac_at(const uint8_t* p) {
  uint64_t mac = 0;
  for (int i = 0; i < 6; ++i) mac = (mac << 8) | p[i];
  return mac;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  double queue_mb = 256.0;
  std::vector<Port> ports;
  std::vector<OutageRule> rules;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: dgc-linkemu [--seed S] [--queue-mb M] PORT...   PORT = IFNAME[:DELAY_MS[:LOSS]]\n"
          "A learning switch between network interfaces: a frame from port A to port B waits\n"
          "DELAY_MS(A) + DELAY_MS(B) and is lost with probability LOSS on each port it crosses.\n"
          "--queue-mb: frames in flight above this are dropped (default 256). Stops on SIGTERM.\n"
          "Outages (every frame on the port dropped, then restored; each may repeat):\n"
          "  --outage IFNAME:START_S:SECONDS             down START_S s after ready, SECONDS long\n"
          "  --random-outages IFNAME:PER_MINUTE:SECONDS  at random, PER_MINUTE a minute on "
          "average\n"
          "  --signal-outage IFNAME:SECONDS              down SECONDS on each SIGUSR1\n");
      return 0;
    }
    if (arg == "--seed" && i + 1 < argc) {
      seed = static_cast<uint64_t>(parse_number(argv[++i], "--seed", 0, 1e18));
    } else if (arg == "--queue-mb" && i + 1 < argc) {
      queue_mb = parse_number(argv[++i], "--queue-mb", 1, 65536);
    } else if ((arg == "--outage" || arg == "--random-outages") && i + 1 < argc) {
      rules.push_back(parse_outage(arg, argv[++i], 2));
    } else if (arg == "--signal-outage" && i + 1 < argc) {
      rules.push_back(parse_outage(arg, argv[++i], 1));
    } else if (!arg.empty() && arg[0] == '-') {
      fail("unknown option '" + arg + "' (see --help)");
    } else {
      ports.push_back(parse_port(arg));
    }
  }
  if (ports.size() < 2) fail("needs at least two ports (see --help)");
  for (auto& rule : rules) {
    for (size_t p = 0; p < ports.size(); ++p) {
      if (ports[p].name == rule.port_name) rule.port = static_cast<int>(p);
    }
    if (rule.port < 0) fail("outage on '" + rule.port_name + "', which is not a port");
  }
  for (auto& port : ports) open_port(port);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_outage_signal);
  std::printf("linkemu: ready, %zu ports", ports.size());
  for (const auto& port : ports) {
    std::printf(" %s(%gms,%g)", port.name.c_str(), port.delay_ms, port.loss);
  }
  std::printf("\n");
  std::fflush(stdout);

  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const auto lost = [&](double p) { return p > 0.0 && uniform(rng) < p; };

  // Outage windows per port; random ones are drawn one ahead (own generator: the loss draws do
  // not move them).
  const int64_t ready_ns = now_ns();
  const auto to_ns = [](double seconds) { return static_cast<int64_t>(seconds * 1e9); };
  std::mt19937_64 outage_rng(seed ^ 0x6f75746167650000ull);
  std::vector<std::vector<Window>> windows(ports.size());
  std::vector<int64_t> next_random(rules.size(), 0);
  const auto draw_gap = [&](const OutageRule& rule) {
    std::exponential_distribution<double> gap(rule.per_minute / 60.0);
    return to_ns(gap(outage_rng));
  };
  for (size_t r = 0; r < rules.size(); ++r) {
    const auto& rule = rules[r];
    if (rule.kind == OutageRule::Kind::kFixed) {
      windows[rule.port].push_back(
          {ready_ns + to_ns(rule.start_s), ready_ns + to_ns(rule.start_s + rule.seconds)});
    } else if (rule.kind == OutageRule::Kind::kRandom) {
      next_random[r] = ready_ns + draw_gap(rule);
    }
  }
  int handled_signals = 0;
  std::vector<char> down_now(ports.size(), 0);
  uint64_t outages = 0, outage_drops = 0;
  const auto down = [&](int port, int64_t t) {
    for (const auto& w : windows[static_cast<size_t>(port)]) {
      if (t >= w.start_ns && t < w.end_ns) return true;
    }
    return false;
  };
  // New windows (random, signalled), and one line per port that went down or came back up.
  const auto update_outages = [&](int64_t t) {
    for (size_t r = 0; r < rules.size(); ++r) {
      const auto& rule = rules[r];
      while (rule.kind == OutageRule::Kind::kRandom && next_random[r] <= t) {
        const int64_t end = next_random[r] + to_ns(rule.seconds);
        windows[rule.port].push_back({next_random[r], end});
        next_random[r] = end + draw_gap(rule);
      }
    }
    const int signals = g_outage_signals;
    for (; handled_signals < signals; ++handled_signals) {
      for (const auto& rule : rules) {
        if (rule.kind == OutageRule::Kind::kSignal) {
          windows[rule.port].push_back({t, t + to_ns(rule.seconds)});
        }
      }
    }
    for (size_t p = 0; p < ports.size(); ++p) {
      const bool is_down = down(static_cast<int>(p), t);
      if (is_down == (down_now[p] != 0)) continue;
      down_now[p] = is_down ? 1 : 0;
      if (is_down) {
        ++outages;
        int64_t end = t;
        for (const auto& w : windows[p]) {
          if (t >= w.start_ns && t < w.end_ns) end = std::max(end, w.end_ns);
        }
        std::printf("linkemu: %s down at %.3f s for %.3f s\n", ports[p].name.c_str(),
                    static_cast<double>(t - ready_ns) / 1e9, static_cast<double>(end - t) / 1e9);
      } else {
        std::printf("linkemu: %s up at %.3f s\n", ports[p].name.c_str(),
                    static_cast<double>(t - ready_ns) / 1e9);
      }
      std::fflush(stdout);
    }
    // Past windows are forgotten.
    for (auto& list : windows) {
      std::erase_if(list, [&](const Window& w) { return w.end_ns <= t; });
    }
  };
  std::unordered_map<uint64_t, int> learnt;  // MAC -> port
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> queue;
  const size_t queue_limit = static_cast<size_t>(queue_mb * 1e6);
  size_t queued_bytes = 0;
  uint64_t seq = 0, forwarded = 0, dropped_lost = 0, dropped_queue = 0, send_errors = 0;
  std::vector<pollfd> fds(ports.size());
  for (size_t p = 0; p < ports.size(); ++p) fds[p] = {ports[p].fd, POLLIN, 0};
  std::vector<uint8_t> buffer(kVnetHeader + 65536 + 64);

  while (!g_stop) {
    // Send what is due.
    int64_t now = now_ns();
    if (!rules.empty()) update_outages(now);
    while (!queue.empty() && queue.top().release_ns <= now) {
      const Pending& due = queue.top();
      if (down_now[static_cast<size_t>(due.port)]) {
        ++outage_drops;  // the link it would leave on is down
        queued_bytes -= due.frame.size();
        queue.pop();
        continue;
      }
      const ssize_t n =
          send(ports[static_cast<size_t>(due.port)].fd, due.frame.data(), due.frame.size(), 0);
      if (n < 0) {
        ++send_errors;  // ENOBUFS: the port's qdisc (tbf) queue is full, as a router would drop
      } else {
        ++forwarded;
      }
      queued_bytes -= due.frame.size();
      queue.pop();
    }
    // Wait for input or the next release, at most 50 ms (to notice a stop request; with
    // outages 10 ms, the resolution of their start and end).
    int64_t wait_ns = rules.empty() ? 50'000'000 : 10'000'000;
    if (!queue.empty())
      wait_ns = std::min(wait_ns, std::max<int64_t>(0, queue.top().release_ns - now));
    const timespec timeout{static_cast<time_t>(wait_ns / 1'000'000'000),
                           static_cast<long>(wait_ns % 1'000'000'000)};
    const int ready = ppoll(fds.data(), fds.size(), &timeout, nullptr);
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail(std::string("poll: ") + std::strerror(errno));
    }
    if (ready == 0) continue;
    now = now_ns();
    for (size_t in = 0; in < ports.size(); ++in) {
      if (!(fds[in].revents & POLLIN)) continue;
      for (int burst = 0; burst < 64; ++burst) {  // bounded: other ports get their turn
        sockaddr_ll from{};
        socklen_t from_len = sizeof from;
        const ssize_t n = recvfrom(ports[in].fd, buffer.data(), buffer.size(), 0,
                                   reinterpret_cast<sockaddr*>(&from), &from_len);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          fail("receive on " + ports[in].name + ": " + std::strerror(errno));
        }
        if (from.sll_pkttype == PACKET_OUTGOING) continue;
        const size_t header = kVnetHeader;
        if (static_cast<size_t>(n) < header + 14) continue;
        const uint8_t* frame = buffer.data() + header;
        const uint64_t destination = mac_at(frame);
        if (down_now[in]) {
          ++outage_drops;  // the link it came in on is down
          continue;
        }
        learnt[mac_at(frame + 6)] = static_cast<int>(in);
        if (lost(ports[in].loss)) {
          ++dropped_lost;
          continue;
        }
        const bool group = (frame[0] & 1) != 0;  // broadcast or multicast
        const auto known = group ? learnt.end() : learnt.find(destination);
        for (size_t out = 0; out < ports.size(); ++out) {
          if (out == in) continue;
          if (known != learnt.end() && static_cast<size_t>(known->second) != out) continue;
          if (down_now[out]) {
            ++outage_drops;
            continue;
          }
          if (lost(ports[out].loss)) {
            ++dropped_lost;
            continue;
          }
          if (queued_bytes + static_cast<size_t>(n) > queue_limit) {
            ++dropped_queue;
            continue;
          }
          const double delay_ms = ports[in].delay_ms + ports[out].delay_ms;
          Pending pending;
          pending.release_ns = now + static_cast<int64_t>(delay_ms * 1e6);
          pending.seq = seq++;
          pending.port = static_cast<int>(out);
          pending.frame.assign(buffer.data(), buffer.data() + n);
          queued_bytes += pending.frame.size();
          queue.push(std::move(pending));
        }
      }
    }
  }
  std::printf(
      "{\"linkemu\":\"stopped\",\"forwarded\":%llu,\"lost\":%llu,\"queue_drops\":%llu,"
      "\"send_errors\":%llu,\"outages\":%llu,\"outage_drops\":%llu}\n",
      static_cast<unsigned long long>(forwarded), static_cast<unsigned long long>(dropped_lost),
      static_cast<unsigned long long>(dropped_queue), static_cast<unsigned long long>(send_errors),
      static_cast<unsigned long long>(outages), static_cast<unsigned long long>(outage_drops));
  return 0;
}
