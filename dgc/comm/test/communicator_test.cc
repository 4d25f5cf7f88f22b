// Ranks as threads over Gloo (run_local): every collective against a closed-form answer, over
// world sizes and message sizes, plus the failure paths (a stalled rank, a rank that throws).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <thread>

#include "dgc/comm/launch.h"
#include "dgc/comm/test/test_process.h"
#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

GlooOptions quick(milliseconds timeout = milliseconds(10000)) {
  GlooOptions options;
  options.timeout = timeout;
  return options;
}

uint8_t pattern(int rank, size_t j) { return static_cast<uint8_t>((rank * 131 + j * 7 + 1) % 251); }

// ---- allgatherv over world sizes x message sizes ----

struct GatherCase {
  int world_size;
  size_t bytes;  // rank r sends bytes + r (so sizes differ), or 0 from every rank when bytes == 0
};

class AllgathervTest : public ::testing::TestWithParam<GatherCase> {};

TEST_P(AllgathervTest, EveryRankGetsEveryMessageExactly) {
  const int n = GetParam().world_size;
  const size_t bytes = GetParam().bytes;
  auto length = [&](int r) -> size_t { return bytes == 0 ? 0 : bytes + r; };
  run_local(n, quick(), [&](Communicator& comm) {
    const int r = comm.rank();
    EXPECT_EQ(comm.size(), n);
    EXPECT_EQ(comm.backend(), "gloo");
    std::vector<uint8_t> mine(length(r));
    for (size_t j = 0; j < mine.size(); ++j) mine[j] = pattern(r, j);
    const auto before = comm.bytes();
    const auto all = comm.allgatherv(mine);
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(all[i].size(), length(i)) << "message of rank " << i << " on rank " << r;
      for (size_t j = 0; j < all[i].size(); ++j) {
        ASSERT_EQ(all[i][j], pattern(i, j)) << "byte " << j << " of rank " << i;
      }
    }
    // Ring: sizes (8 bytes from each rank) then payload; rank r forwards all but (r+1)'s.
    uint64_t total = 0;
    for (int i = 0; i < n; ++i) total += length(i);
    const uint64_t sizes = n > 1 ? 8 * (n - 1) : 0;
    const uint64_t payload_sent = n > 1 ? total - length((r + 1) % n) : 0;
    const uint64_t payload_received = n > 1 ? total - length(r) : 0;
    EXPECT_EQ(comm.bytes().sent - before.sent, sizes + payload_sent);
    EXPECT_EQ(comm.bytes().received - before.received, sizes + payload_received);
  });
}

std::vector<GatherCase> gather_cases() {
  std::vector<GatherCase> cases;
  for (int n : {1, 2, 3, 4, 8}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, (size_t{1} << 20) + 5}) {
      cases.push_back({n, bytes});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndMessageSizes, AllgathervTest,
                         ::testing::ValuesIn(gather_cases()), [](const auto& param_info) {
                           return "n" + std::to_string(param_info.param.world_size) + "_bytes" +
                                  std::to_string(param_info.param.bytes);
                         });

TEST(Allgatherv, OnlySomeRanksSendEmptyMessages) {
  run_local(4, quick(), [](Communicator& comm) {
    const int r = comm.rank();
    std::vector<uint8_t> mine(r % 2 == 0 ? 0 : 3 * r);
    for (size_t j = 0; j < mine.size(); ++j) mine[j] = pattern(r, j);
    for (int round = 0; round < 3; ++round) {
      const auto all = comm.allgatherv(mine);
      for (int i = 0; i < 4; ++i) {
        ASSERT_EQ(all[i].size(), i % 2 == 0 ? 0u : 3u * i);
        for (size_t j = 0; j < all[i].size(); ++j) ASSERT_EQ(all[i][j], pattern(i, j));
      }
    }
  });
}

// ---- alltoallv over world sizes x message sizes ----

// Rank `from` sends length(from, to) bytes of pattern(from * 16 + to, j) to rank `to`; some pairs
// send nothing (every third pair, and everything when bytes == 0).
size_t pair_length(size_t bytes, int from, int to) {
  if (bytes == 0 || (from + 2 * to) % 3 == 0) return 0;
  return bytes + static_cast<size_t>(from * 3 + to);
}

class AlltoallvTest : public ::testing::TestWithParam<GatherCase> {};

TEST_P(AlltoallvTest, EveryRankGetsWhatEachPeerSentIt) {
  const int n = GetParam().world_size;
  const size_t bytes = GetParam().bytes;
  run_local(n, quick(), [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<uint8_t>> to(n);
    for (int p = 0; p < n; ++p) {
      to[p].resize(pair_length(bytes, r, p));
      for (size_t j = 0; j < to[p].size(); ++j) to[p][j] = pattern(r * 16 + p, j);
    }
    const std::vector<std::span<const uint8_t>> spans(to.begin(), to.end());
    for (int round = 0; round < 2; ++round) {
      const auto before = comm.bytes();
      const auto got = comm.alltoallv(spans);
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      uint64_t sent = 0, received = 0;
      for (int p = 0; p < n; ++p) {
        ASSERT_EQ(got[p].size(), pair_length(bytes, p, r)) << "from rank " << p << " on " << r;
        for (size_t j = 0; j < got[p].size(); ++j) {
          ASSERT_EQ(got[p][j], pattern(p * 16 + r, j)) << "byte " << j << " from rank " << p;
        }
        if (p != r) {
          sent += 8 + pair_length(bytes, r, p);
          received += 8 + pair_length(bytes, p, r);
        }
      }
      // Direct: sizes (8 bytes per peer) then each payload once; nothing forwarded.
      EXPECT_EQ(comm.bytes().sent - before.sent, sent);
      EXPECT_EQ(comm.bytes().received - before.received, received);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndMessageSizes, AlltoallvTest,
                         ::testing::ValuesIn(gather_cases()), [](const auto& param_info) {
                           return "n" + std::to_string(param_info.param.world_size) + "_bytes" +
                                  std::to_string(param_info.param.bytes);
                         });

// Records what alltoallv hands the engine: the send buffer's size and each message's offset.
class SendRecorder : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  size_t send_bytes = 0;
  std::vector<uint64_t> offsets;

 protected:
  void alltoallv_payload(std::span<const uint8_t> send, std::span<const uint64_t> send_offsets,
                         std::span<const uint64_t> send_sizes, std::span<uint8_t> receive,
                         std::span<const uint64_t> receive_sizes, const Call& call) override {
    send_bytes = send.size();
    offsets.assign(send_offsets.begin(), send_offsets.end());
    ForwardingCommunicator::alltoallv_payload(send, send_offsets, send_sizes, receive,
                                              receive_sizes, call);
  }
};

TEST(Alltoallv, OneMessageToEveryRankTravelsFromItsOneCopyAndOthersArePacked) {
  constexpr int n = 4;
  run_local(n, quick(), [&](Communicator& inner) {
    SendRecorder comm(inner);
    const int r = comm.rank();
    std::vector<uint8_t> mine(100 + static_cast<size_t>(r));
    for (size_t j = 0; j < mine.size(); ++j) mine[j] = pattern(r, j);
    const auto expect_every_message = [&](const std::vector<std::vector<uint8_t>>& got) {
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) {
        ASSERT_EQ(got[p].size(), 100u + static_cast<size_t>(p)) << "from rank " << p;
        for (size_t j = 0; j < got[p].size(); ++j) ASSERT_EQ(got[p][j], pattern(p, j));
      }
    };
    const std::vector<std::span<const uint8_t>> same(n, mine);
    expect_every_message(comm.alltoallv(same));
    EXPECT_EQ(comm.send_bytes, mine.size()) << "one copy, not " << n;
    EXPECT_EQ(comm.offsets, std::vector<uint64_t>(n, 0));
    // Equal contents in separate buffers: packed back to back as before.
    const std::vector<std::vector<uint8_t>> copies(n, mine);
    const std::vector<std::span<const uint8_t>> separate(copies.begin(), copies.end());
    expect_every_message(comm.alltoallv(separate));
    EXPECT_EQ(comm.send_bytes, n * mine.size());
    const uint64_t m = mine.size();
    EXPECT_EQ(comm.offsets, (std::vector<uint64_t>{0, m, 2 * m, 3 * m}));
  });
}

TEST(Alltoallv, RejectsAWrongNumberOfMessagesBeforeSendingAnything) {
  run_local(2, quick(), [](Communicator& comm) {
    const std::vector<uint8_t> one(3, 1);
    const std::vector<std::span<const uint8_t>> too_few = {one};
    EXPECT_THROW(comm.alltoallv(too_few), InvalidArgument);
    // The communicator is still usable: nothing was sent.
    const std::vector<std::span<const uint8_t>> right = {one, one};
    const auto got = comm.alltoallv(right);
    EXPECT_EQ(got[1 - comm.rank()].size(), 3u);
  });
}

TEST(Alltoallv, StalledRankMakesEveryOtherRankFailWithinTheTimeout) {
  constexpr int n = 4;
  constexpr int stalled = 1;
  const milliseconds timeout(1500);
  std::mutex mutex;
  std::vector<std::string> errors(n);
  std::vector<milliseconds> elapsed(n, milliseconds(0));
  int timed_out = 0;
  std::atomic<int> finished{0};
  run_local(n, quick(), [&](Communicator& comm) {
    const std::vector<uint8_t> m(100, 7);
    const std::vector<std::span<const uint8_t>> spans(n, m);
    comm.alltoallv(spans, milliseconds(10000));  // everyone is connected and working
    if (comm.rank() == stalled) {
      const auto deadline = Clock::now() + milliseconds(15000);  // bounded
      while (finished.load() < n - 1 && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      return;
    }
    const auto start = Clock::now();
    std::string error = "no error";
    bool was_timeout = false;
    try {
      comm.alltoallv(spans, timeout);
    } catch (const TimeoutError& e) {
      error = e.what();
      was_timeout = true;
    } catch (const CommError& e) {
      error = e.what();
    }
    std::lock_guard lock(mutex);
    errors[comm.rank()] = error;
    elapsed[comm.rank()] = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    timed_out += was_timeout ? 1 : 0;
    finished.fetch_add(1);
  });
  for (int r = 0; r < n; ++r) {
    if (r == stalled) continue;
    EXPECT_NE(errors[r], "no error") << "rank " << r;
    EXPECT_LE(elapsed[r], timeout + milliseconds(3000)) << "rank " << r << ": " << errors[r];
    std::printf("rank %d after %lld ms: %s\n", r, static_cast<long long>(elapsed[r].count()),
                errors[r].c_str());
  }
  EXPECT_GE(timed_out, 1) << "the ranks waiting on the stalled one report a TimeoutError";
}

// ---- allreduce, broadcast, barrier ----

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, AllreduceSumsRankDistinctValues) {
  const int n = GetParam();
  run_local(n, quick(), [n](Communicator& comm) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, (size_t{1} << 18) + 1}) {
      std::vector<float> values(count);
      for (size_t j = 0; j < count; ++j) values[j] = static_cast<float>(comm.rank() + j % 11);
      const auto before = comm.bytes();
      comm.allreduce_sum(values);
      for (size_t j = 0; j < count; ++j) {
        ASSERT_EQ(values[j], static_cast<float>(n * (n - 1) / 2 + n * (j % 11))) << "element " << j;
      }
      const uint64_t expected = n > 1 ? 2 * (n - 1) * (4 * count) / n : 0;
      EXPECT_EQ(comm.bytes().sent - before.sent, expected);
      EXPECT_EQ(comm.bytes().received - before.received, expected);
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const int n = GetParam();
  std::vector<ByteCounters> totals(n);
  run_local(n, quick(), [&](Communicator& comm) {
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> data(1000 + root);
      for (size_t j = 0; j < data.size(); ++j) data[j] = pattern(comm.rank(), j);
      comm.broadcast(data, root);
      for (size_t j = 0; j < data.size(); ++j) ASSERT_EQ(data[j], pattern(root, j));
    }
    std::vector<float> floats(100, static_cast<float>(comm.rank() + 1));
    broadcast_floats(comm, floats, 0);
    for (float f : floats) ASSERT_EQ(f, 1.0f);
    totals[comm.rank()] = comm.bytes();
  });
  // A tree broadcast delivers the buffer once to every non-root rank: in total (n-1)*B is sent
  // and (n-1)*B received, summed over roots.
  uint64_t sent = 0, received = 0;
  for (const auto& t : totals) {
    sent += t.sent;
    received += t.received;
  }
  uint64_t expected = 400 * static_cast<uint64_t>(n - 1);
  for (int root = 0; root < n; ++root) expected += static_cast<uint64_t>(n - 1) * (1000 + root);
  EXPECT_EQ(sent, expected);
  EXPECT_EQ(received, expected);
}

TEST_P(CollectivesTest, BarrierWaitsForTheSlowestRank) {
  const int n = GetParam();
  std::atomic<int> arrived{0};
  run_local(n, quick(), [&](Communicator& comm) {
    if (comm.rank() == n - 1) std::this_thread::sleep_for(milliseconds(200));
    arrived.fetch_add(1);
    comm.barrier();
    EXPECT_EQ(arrived.load(), n) << "rank " << comm.rank() << " left the barrier early";
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(Collectives, BroadcastRejectsABadRoot) {
  run_local(2, quick(), [](Communicator& comm) {
    std::vector<uint8_t> data(4);
    EXPECT_THROW(comm.broadcast(data, 2), InvalidArgument);
    EXPECT_THROW(comm.broadcast(data, -1), InvalidArgument);
  });
}

// ---- failures ----

TEST(Failure, StalledRankMakesEveryOtherRankFailWithinTheTimeout) {
  constexpr int n = 4;
  constexpr int stalled = 2;
  const milliseconds timeout(1500);
  std::mutex mutex;
  std::vector<std::string> errors(n);
  std::vector<bool> timeouts(n, false);
  std::vector<milliseconds> elapsed(n, milliseconds(0));
  std::atomic<int> finished{0};
  run_local(n, quick(), [&](Communicator& comm) {
    std::vector<float> values(1024, 1.0f);
    comm.allreduce_sum(values, milliseconds(10000));  // everyone is connected and working
    if (comm.rank() == stalled) {
      // Stops participating; bounded wait until the others have given up.
      const auto deadline = Clock::now() + milliseconds(15000);
      while (finished.load() < n - 1 && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      return;
    }
    const auto start = Clock::now();
    try {
      comm.allreduce_sum(values, timeout);
      std::lock_guard lock(mutex);
      errors[comm.rank()] = "no error";
    } catch (const TimeoutError& e) {
      std::lock_guard lock(mutex);
      errors[comm.rank()] = e.what();
      timeouts[comm.rank()] = true;
    } catch (const CommError& e) {
      std::lock_guard lock(mutex);
      errors[comm.rank()] = e.what();
    }
    elapsed[comm.rank()] = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    // After an error the communicator refuses further work at once.
    EXPECT_THROW(comm.barrier(timeout), CommError);
    finished.fetch_add(1);
  });
  int timed_out = 0;
  for (int r = 0; r < n; ++r) {
    if (r == stalled) continue;
    EXPECT_NE(errors[r], "no error") << "rank " << r;
    EXPECT_FALSE(errors[r].empty()) << "rank " << r;
    // Slack for a loaded machine; unloaded it is ~20 ms.
    EXPECT_LE(elapsed[r], timeout + milliseconds(3000)) << "rank " << r << ": " << errors[r];
    timed_out += timeouts[r] ? 1 : 0;
    std::printf("rank %d after %lld ms: %s\n", r, static_cast<long long>(elapsed[r].count()),
                errors[r].c_str());
  }
  EXPECT_GE(timed_out, 1) << "the ranks waiting on the stalled one report a TimeoutError";
  // Its ring neighbours say they were waiting on it.
  int named = 0;
  for (const auto& e : errors) {
    named += e.find("receive from rank 2 (") != std::string::npos ||
             e.find("send to rank 2 (") != std::string::npos;
  }
  EXPECT_GE(named, 1);
}

TEST(Failure, RankThatThrowsReleasesItsPeersPromptly) {
  constexpr int n = 3;
  const milliseconds timeout(20000);  // the peers must learn long before this
  std::vector<milliseconds> elapsed(n, milliseconds(0));
  // Not vector<bool>: each rank's thread writes its own entry, and bits share a word.
  std::vector<char> comm_error(n, 0);
  try {
    run_local(n, quick(timeout), [&](Communicator& comm) {
      comm.barrier();
      if (comm.rank() == 1) throw NumericError("rank 1 gives up");
      const auto start = Clock::now();
      try {
        std::vector<float> values(16, 1.0f);
        comm.allreduce_sum(values, timeout);
      } catch (const CommError&) {
        comm_error[comm.rank()] = 1;
      }
      elapsed[comm.rank()] = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    });
    FAIL() << "run_local must rethrow rank 1's exception";
  } catch (const NumericError& e) {
    EXPECT_STREQ(e.what(), "rank 1 gives up");
  }
  for (int r : {0, 2}) {
    EXPECT_TRUE(comm_error[r]) << "rank " << r;
    EXPECT_LT(elapsed[r], milliseconds(5000)) << "rank " << r;
  }
}

TEST(Failure, DefaultTimeoutComesFromTheOptions) {
  constexpr int n = 2;
  std::vector<milliseconds> elapsed(n, milliseconds(0));
  run_local(n, quick(milliseconds(1500)), [&](Communicator& comm) {
    EXPECT_EQ(comm.default_timeout(), milliseconds(1500));
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(milliseconds(3000));
      return;
    }
    const auto start = Clock::now();
    std::vector<uint8_t> message(10);
    EXPECT_THROW(comm.allgatherv(message), TimeoutError);  // kUnsetTimeout -> the default, 1500 ms
    elapsed[0] = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  });
  EXPECT_GE(elapsed[0], milliseconds(1400));
  EXPECT_LE(elapsed[0], milliseconds(1500 + 3000));
}

// ---- rendezvous errors ----

TEST(Rendezvous, SharedDirectoryWorksOnceAndRefusesAStaleDirectory) {
  test::TempDir dir("dgc-comm-dir-");
  auto run = [&](std::vector<std::string>& errors) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto comm = connect_gloo_file(dir.path() + "/run", r, 2, quick(milliseconds(3000)));
          std::vector<float> values(3, 1.0f);
          comm->allreduce_sum(values);
          EXPECT_EQ(values[0], 2.0f);
        } catch (const CommError& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  };
  std::vector<std::string> first(2), second(2);
  run(first);
  EXPECT_EQ(first, (std::vector<std::string>{"", ""}));
  run(second);  // same directory again: the keys of the first run are still there
  for (const auto& e : second) {
    EXPECT_NE(e.find("give every run a fresh, empty rendezvous directory"), std::string::npos) << e;
  }
}

TEST(Rendezvous, OneRankThroughEveryStore) {
  test::TempDir dir("dgc-comm-dir-");
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.push_back(connect_gloo_file(dir.path(), 0, 1, quick()));
  comms.push_back(connect_gloo_tcp({"127.0.0.1", test::free_port()}, 0, 1, quick()));
  for (auto& comm : comms) {
    EXPECT_EQ(comm->size(), 1);
    const std::vector<uint8_t> message = {1, 2, 3};
    EXPECT_EQ(comm->allgatherv(message), std::vector<std::vector<uint8_t>>{message});
    std::vector<float> values = {1.5f};
    comm->allreduce_sum(values);
    EXPECT_EQ(values[0], 1.5f);
    comm->barrier();
  }
}

TEST(Rendezvous, MissingRanksAreNamedAtTheTimeout) {
  test::TempDir dir("dgc-comm-dir-");
  const auto start = Clock::now();
  try {
    connect_gloo_file(dir.path(), 0, 3, quick(milliseconds(600)));
    FAIL() << "ranks 1 and 2 never come";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 of 3 did not join within 600 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(2000));

  const int port = test::free_port();
  try {
    connect_gloo_tcp({"127.0.0.1", port}, 0, 2, quick(milliseconds(600)));
    FAIL() << "rank 1 never comes";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 of 2 did not join"), std::string::npos)
        << e.what();
  }
}

TEST(Rendezvous, DgcsOwnStoreRefusesTorchrunsAgentStoreWithWhatToDo) {
  ASSERT_FALSE(have_c10d_store()) << "dgc::comm alone must not switch to libtorch's store";
  const TcpRendezvous where{"127.0.0.1", test::free_port(), /*agent_store=*/true, "dgc"};
  try {
    connect_gloo_tcp(where, 0, 1, quick(milliseconds(600)));
    FAIL() << "dgc's own store cannot be torchrun's agent store";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("use_c10d_store()"), std::string::npos) << e.what();
  }
}

TEST(RunLocal, RejectsABadWorldSize) {
  EXPECT_THROW(run_local(0, quick(), [](Communicator&) {}), InvalidArgument);
}

// ---- what the base does for every backend ----

// Rank 0 of two, with a scripted peer: the peer announces `peer_size` bytes and sends a pattern.
// Counts the primitive calls and records the timeout each was given.
class ScriptedCommunicator final : public Communicator {
 public:
  explicit ScriptedCommunicator(uint64_t peer_size)
      : Communicator(milliseconds(1500)), peer_size_(peer_size) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "scripted"; }
  int primitives = 0;
  int failures = 0;
  milliseconds last_timeout{0};
  bool stall = false;  // the next primitive times out

 protected:
  std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call& call) override {
    enter(call);
    return {mine, peer_size_};
  }
  void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                          const Call& call) override {
    enter(call);
    for (uint64_t j = 0; j < sizes[1]; ++j) flat[sizes[0] + j] = pattern(1, j);
  }
  std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t>, const Call& call) override {
    enter(call);
    return {0, peer_size_};
  }
  void alltoallv_payload(std::span<const uint8_t>, std::span<const uint64_t>,
                         std::span<const uint64_t>, std::span<uint8_t>, std::span<const uint64_t>,
                         const Call& call) override {
    enter(call);
  }
  void allreduce_sum_primitive(std::span<float>, const Call& call) override { enter(call); }
  void broadcast_primitive(std::span<uint8_t>, int, const Call& call) override { enter(call); }
  void barrier_primitive(const Call& call) override { enter(call); }
  void on_failure() override { ++failures; }

 private:
  void enter(const Call& call) {
    ++primitives;
    last_timeout = call.timeout;
    if (stall) throw TimeoutError(std::string("scripted ") + call.op + " timed out");
  }
  uint64_t peer_size_;
};

TEST(CommunicatorBase, AnnouncedSizeOverTheLimitIsRefusedBeforeThePayloadAndForGood) {
  ScriptedCommunicator comm(kMaxMessageBytes + 1);
  const std::vector<uint8_t> message(10, 7);
  try {
    comm.allgatherv(message);
    FAIL() << "accepted a 16 GiB announcement";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("allgatherv: rank 1 announced a message of 17179869185 "
                                         "bytes, over the limit of 17179869184"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(comm.primitives, 1) << "only the sizes travelled";
  EXPECT_EQ(comm.failures, 1);
  EXPECT_FALSE(comm.failure().empty());
  // Unusable from now on, without touching the transport.
  try {
    comm.barrier();
    FAIL() << "a failed communicator ran a barrier";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("scripted barrier on rank 0: the communicator is unusable "
                                         "after an earlier error: allgatherv: rank 1 announced"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(comm.primitives, 1);
  EXPECT_EQ(comm.failures, 1) << "on_failure runs once";

  ScriptedCommunicator direct(kMaxMessageBytes + 1);
  const std::vector<std::span<const uint8_t>> two = {message, message};
  EXPECT_THROW(direct.alltoallv(two), CommError);
  EXPECT_EQ(direct.primitives, 1);
}

TEST(CommunicatorBase, UnsetTimeoutIsTheDefaultAndAnExplicitOneIsUsedAsGiven) {
  ScriptedCommunicator comm(3);
  comm.barrier();
  EXPECT_EQ(comm.last_timeout, milliseconds(1500));
  comm.barrier(kUnsetTimeout);
  EXPECT_EQ(comm.last_timeout, milliseconds(1500));
  comm.barrier(milliseconds(20));
  EXPECT_EQ(comm.last_timeout, milliseconds(20));
  // Not a timeout: refused before anything runs, and the communicator stays usable.
  EXPECT_THROW(comm.barrier(milliseconds(0)), InvalidArgument);
  EXPECT_THROW(comm.barrier(milliseconds(-5)), InvalidArgument);
  EXPECT_EQ(comm.primitives, 3);
  EXPECT_TRUE(comm.failure().empty());
}

TEST(CommunicatorBase, ArgumentErrorsSendNothingAndLeaveTheCommunicatorUsable) {
  ScriptedCommunicator comm(3);
  const std::vector<uint8_t> message(4, 1);
  const std::vector<std::span<const uint8_t>> three = {message, message, message};
  EXPECT_THROW(comm.alltoallv(three), InvalidArgument);
  std::vector<uint8_t> data(4);
  EXPECT_THROW(comm.broadcast(data, 2), InvalidArgument);
  EXPECT_EQ(comm.primitives, 0);
  EXPECT_TRUE(comm.failure().empty());
  // Nothing to do: no primitive runs.
  comm.allreduce_sum({});
  comm.broadcast({}, 0);
  EXPECT_EQ(comm.primitives, 0);
}

TEST(CommunicatorBase, AFailedPrimitiveKeepsItsErrorTypeAndMarksTheCommunicator) {
  ScriptedCommunicator comm(3);
  comm.stall = true;
  std::vector<float> values(8, 1.0f);
  EXPECT_THROW(comm.allreduce_sum(values), TimeoutError);
  EXPECT_EQ(comm.failure(), "scripted allreduce timed out");
  EXPECT_EQ(comm.failures, 1);
  comm.stall = false;
  EXPECT_THROW(comm.allreduce_sum(values), CommError);
  EXPECT_EQ(comm.primitives, 1);
}

TEST(CommunicatorBase, AllgathervAssemblesTheMessagesAndCountsRingBytes) {
  ScriptedCommunicator comm(5);
  const std::vector<uint8_t> message = {1, 2, 3};
  const auto all = comm.allgatherv(message);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], message);
  ASSERT_EQ(all[1].size(), 5u);
  for (size_t j = 0; j < 5; ++j) EXPECT_EQ(all[1][j], pattern(1, j));
  // Sizes: 8 bytes each way; payload: a ring of two sends its own 3 and receives the peer's 5.
  EXPECT_EQ(comm.bytes().sent, 8u + 3u);
  EXPECT_EQ(comm.bytes().received, 8u + 5u);
}

// ---- wire byte formulas ----

TEST(WireBytes, RingAllgathervForwardsAllButTheNextRanksMessage) {
  const std::vector<uint64_t> sizes = {10, 20, 30, 40};
  for (int r = 0; r < 4; ++r) {
    const auto c = ring_allgatherv_bytes(sizes, r);
    EXPECT_EQ(c.sent, 100 - sizes[(r + 1) % 4]);
    EXPECT_EQ(c.received, 100 - sizes[r]);
  }
  EXPECT_EQ(ring_allgatherv_bytes(std::vector<uint64_t>{5}, 0).sent, 0u);
}

TEST(WireBytes, DirectAlltoallvSendsEachPayloadOnceAndEightBytesPerPeer) {
  const std::vector<uint64_t> send = {5, 10, 20}, receive = {1, 2, 3};
  const ByteCounters c = direct_alltoallv_bytes(send, receive, 1);
  EXPECT_EQ(c.sent, 8 + 5 + 8 + 20u);
  EXPECT_EQ(c.received, 8 + 1 + 8 + 3u);
  const std::vector<uint64_t> one = {9};
  EXPECT_EQ(direct_alltoallv_bytes(one, one, 0).sent, 0u);
  EXPECT_THROW(direct_alltoallv_bytes(send, one, 0), InvalidArgument);
}

TEST(WireBytes, RingAllreduceSendsTwoNMinusOneOverNOfTheBuffer) {
  EXPECT_EQ(ring_allreduce_bytes(1000, 1).sent, 0u);
  EXPECT_EQ(ring_allreduce_bytes(1000, 2).sent, 1000u);
  EXPECT_EQ(ring_allreduce_bytes(1000, 4).sent, 1500u);
  EXPECT_EQ(ring_allreduce_bytes(800, 8).received, 1400u);
}

TEST(WireBytes, TreeBroadcastSendsEachBufferOncePerChild) {
  for (int n : {1, 2, 3, 5, 8, 13}) {
    for (int root = 0; root < n; ++root) {
      uint64_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        const auto c = tree_broadcast_bytes(100, r, root, n);
        sent += c.sent;
        received += c.received;
        EXPECT_EQ(c.received, r == root ? 0u : 100u);
      }
      EXPECT_EQ(sent, 100u * (n - 1));
      EXPECT_EQ(received, 100u * (n - 1));
    }
  }
  EXPECT_EQ(tree_broadcast_bytes(10, 0, 0, 8).sent, 30u);  // root of 8: three children
}

}  // namespace
}  // namespace dgc::comm
