// A rank of a multi-process comm test (see worker_common.h for how it connects).
//
//   comm_worker collectives ...   every collective once (alltoallv included), with rank-distinct
//   data whose result
//                                 has a closed form; exits 0 if all match, 2 otherwise.
//   comm_worker loop --iterations K [--stall-rank R --stall-at I] ...
//                                 K rounds of allreduce + allgatherv, printing "iteration i"
//                                 after each; rank R stops participating at iteration I (it
//                                 sleeps, bounded). Used for the killed- and stalled-peer tests.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "dgc/comm/test/worker_common.h"

namespace {

using dgc::comm::Communicator;

bool check(bool ok, const char* what, int rank) {
  if (!ok) std::fprintf(stderr, "rank %d: check failed: %s\n", rank, what);
  return ok;
}

int collectives(Communicator& comm) {
  const int r = comm.rank();
  const int n = comm.size();
  bool ok = true;

  // allgatherv: rank i sends (i * 1000 + 1) bytes of pattern (i * 7 + j) mod 251; plus a large
  // (1 MiB + i) message and an empty one from every rank.
  for (const size_t base : {size_t{0}, size_t{1000}, size_t{1} << 20}) {
    auto length = [&](int i) { return base == 0 ? 0 : base * (base > 1000 ? 1 : i) + i + 1; };
    std::vector<uint8_t> mine(length(r));
    for (size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<uint8_t>((r * 7 + j) % 251);
    const auto all = comm.allgatherv(mine);
    ok = check(static_cast<int>(all.size()) == n, "allgatherv returns one message per rank", r) &&
         ok;
    for (int i = 0; i < n && ok; ++i) {
      bool same = all[i].size() == length(i);
      for (size_t j = 0; same && j < all[i].size(); ++j) {
        same = all[i][j] == static_cast<uint8_t>((i * 7 + j) % 251);
      }
      ok = check(same, "allgatherv payload of every rank", r) && ok;
    }
  }

  // alltoallv: rank i sends (i * 100 + p * 10) bytes of pattern (i * 7 + p * 3 + j) mod 251 to
  // rank p (so rank 0 sends nothing to itself and rank 0's message to rank 0 is empty).
  {
    auto length = [](int from, int to) { return static_cast<size_t>(from * 100 + to * 10); };
    auto byte = [](int from, int to, size_t j) {
      return static_cast<uint8_t>((from * 7 + to * 3 + j) % 251);
    };
    std::vector<std::vector<uint8_t>> to(n);
    for (int p = 0; p < n; ++p) {
      to[p].resize(length(r, p));
      for (size_t j = 0; j < to[p].size(); ++j) to[p][j] = byte(r, p, j);
    }
    const std::vector<std::span<const uint8_t>> spans(to.begin(), to.end());
    const auto got = comm.alltoallv(spans);
    bool same = static_cast<int>(got.size()) == n;
    for (int p = 0; same && p < n; ++p) {
      same = got[p].size() == length(p, r);
      for (size_t j = 0; same && j < got[p].size(); ++j) same = got[p][j] == byte(p, r, j);
    }
    ok = check(same, "alltoallv payload from every rank", r) && ok;
  }

  // alltoallv of one message to every rank (sent from its one copy, every displacement 0):
  // rank i sends (i * 50 + 7) bytes of pattern (i * 11 + j) mod 251.
  {
    auto length = [](int from) { return static_cast<size_t>(from * 50 + 7); };
    std::vector<uint8_t> mine(length(r));
    for (size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<uint8_t>((r * 11 + j) % 251);
    const std::vector<std::span<const uint8_t>> spans(n, mine);
    const auto got = comm.alltoallv(spans);
    bool same = static_cast<int>(got.size()) == n;
    for (int p = 0; same && p < n; ++p) {
      same = got[p].size() == length(p);
      for (size_t j = 0; same && j < got[p].size(); ++j) {
        same = got[p][j] == static_cast<uint8_t>((p * 11 + j) % 251);
      }
    }
    ok = check(same, "alltoallv of one message to every rank", r) && ok;
  }

  // allreduce: values[j] = rank + j % 5 -> sum = n(n-1)/2 + n * (j % 5), exact in float.
  std::vector<float> values((1 << 18) + 3);
  for (size_t j = 0; j < values.size(); ++j) values[j] = static_cast<float>(r + j % 5);
  comm.allreduce_sum(values);
  bool sums = true;
  for (size_t j = 0; j < values.size(); ++j) {
    sums = sums && values[j] == static_cast<float>(n * (n - 1) / 2 + n * (j % 5));
  }
  ok = check(sums, "allreduce sum", r) && ok;

  // broadcast from the last rank.
  std::vector<uint8_t> data(4099);
  for (size_t j = 0; j < data.size(); ++j) data[j] = static_cast<uint8_t>((r + 3) * (j + 1));
  comm.broadcast(data, n - 1);
  bool same = true;
  for (size_t j = 0; j < data.size(); ++j) {
    same = same && data[j] == static_cast<uint8_t>((n - 1 + 3) * (j + 1));
  }
  ok = check(same, "broadcast from the last rank", r) && ok;

  comm.barrier();
  std::printf("rank %d of %d (%s): collectives %s; wire bytes sent %llu received %llu\n", r, n,
              comm.backend().c_str(), ok ? "ok" : "FAILED",
              static_cast<unsigned long long>(comm.bytes().sent),
              static_cast<unsigned long long>(comm.bytes().received));
  return ok ? dgc::test::kExitOk : dgc::test::kExitCheckFailed;
}

int loop(Communicator& comm, const std::map<std::string, std::string>& args) {
  auto get = [&](const char* name, int fallback) {
    auto it = args.find(name);
    return it == args.end() ? fallback : std::stoi(it->second);
  };
  const int iterations = get("--iterations", 100);
  const int stall_rank = get("--stall-rank", -1);
  const int stall_at = get("--stall-at", -1);
  std::vector<float> values(4096);
  std::vector<uint8_t> message(512);
  for (int i = 0; i < iterations; ++i) {
    if (comm.rank() == stall_rank && i == stall_at) {
      std::printf("rank %d stalls at iteration %d\n", comm.rank(), i);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(30));  // bounded; the test kills it
      return dgc::test::kExitOk;
    }
    for (auto& v : values) v = 1.0f;
    comm.allreduce_sum(values);
    if (values[0] != static_cast<float>(comm.size())) return dgc::test::kExitCheckFailed;
    comm.allgatherv(message);
    std::printf("rank %d iteration %d\n", comm.rank(), i);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return dgc::test::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_worker collectives|loop [--name value]...\n");
    return dgc::test::kExitOtherError;
  }
  const std::string mode = argv[1];
  const auto args = dgc::test::parse_args(argc, argv, 2);
  return dgc::test::run_worker([&] {
    auto comm = dgc::test::connect_worker(args);
    if (mode == "collectives") return collectives(*comm);
    if (mode == "loop") return loop(*comm, args);
    throw dgc::InvalidArgument("unknown mode " + mode);
  });
}
