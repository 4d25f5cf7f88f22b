// The torchrun-style TCP rendezvous store: set/get/wait/check between ranks, bounded waits, and
// the errors a user meets (port taken, master unreachable, world size or rank mismatch).
#include "dgc/comm/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "dgc/comm/launch.h"
#include "dgc/comm/tcp_store_service.h"
#include "dgc/comm/test/test_process.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TcpStore, RanksSeeEachOthersKeys) {
  const int port = test::free_port();
  auto rank1 = std::async(std::launch::async, [&] {
    TcpStore store("127.0.0.1", port, 1, 2, milliseconds(5000));
    store.set("from1", bytes("one"));
    store.wait({"from0"});
    EXPECT_EQ(store.get("from0"), bytes("zero"));
    EXPECT_TRUE(store.check({"from0", "from1"}));
    EXPECT_EQ(store.local_address(), "127.0.0.1");
    store.close(milliseconds(5000));
  });
  TcpStore store("127.0.0.1", port, 0, 2, milliseconds(5000));
  store.set("from0", bytes("zero"));
  EXPECT_EQ(store.get("from1"), bytes("one"));  // get waits for the key
  EXPECT_FALSE(store.check({"never"}));
  std::vector<char> big(1 << 20, 'x');
  store.set("big", big);
  EXPECT_EQ(store.get("big"), big);
  store.set("empty", {});
  EXPECT_EQ(store.get("empty"), std::vector<char>{});
  store.set("from0", bytes("overwritten"));
  EXPECT_EQ(store.get("from0"), bytes("overwritten"));
  store.close(milliseconds(5000));
  rank1.get();
}

TEST(TcpStore, WaitIsBoundedAndNamesTheKeys) {
  const int port = test::free_port();
  TcpStore store("127.0.0.1", port, 0, 1, milliseconds(5000));
  const auto start = Clock::now();
  try {
    store.wait({"missing-key"}, milliseconds(300));
    FAIL() << "wait must time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos) << e.what();
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(300));
  EXPECT_LT(elapsed, milliseconds(2000));
}

TEST(TcpStore, OversizedValuesAreRefused) {
  const int port = test::free_port();
  TcpStore store("127.0.0.1", port, 0, 1, milliseconds(5000));
  EXPECT_THROW(store.set("k", std::vector<char>((1 << 20) + 1)), InvalidArgument);
  EXPECT_THROW(store.set(std::string(5000, 'k'), bytes("v")), InvalidArgument);
}

TEST(TcpStore, PortInUseIsAClearError) {
  // Hold the port with a listening socket of our own.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  try {
    TcpStore store("127.0.0.1", port, 0, 2, milliseconds(2000));
    FAIL() << "rank 0 must not start on a taken port";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MASTER_PORT " + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find("already in use"), std::string::npos) << what;
  }
  ::close(fd);
}

TEST(TcpStore, UnreachableMasterTimesOutWithAClearError) {
  const int port = test::free_port();  // nobody listens there
  const auto start = Clock::now();
  try {
    TcpStore store("127.0.0.1", port, 1, 2, milliseconds(700));
    FAIL() << "rank 1 cannot reach a master that does not exist";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("could not reach"), std::string::npos) << what;
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(500));
  EXPECT_LT(elapsed, milliseconds(3000));
}

TEST(TcpStore, WorldSizeMismatchStopsEveryRank) {
  const int port = test::free_port();
  TcpStore master("127.0.0.1", port, 0, 2, milliseconds(5000));
  try {
    TcpStore wrong("127.0.0.1", port, 1, 3, milliseconds(5000));
    FAIL() << "a rank with another world size must be refused";
  } catch (const MismatchError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("WORLD_SIZE=3"), std::string::npos) << what;
    EXPECT_NE(what.find("WORLD_SIZE=2"), std::string::npos) << what;
  }
  // The master learns too: its next request fails with the same explanation.
  EXPECT_THROW(master.check({"anything"}), MismatchError);
}

TEST(TcpStore, DuplicateRankIsRefused) {
  const int port = test::free_port();
  TcpStore master("127.0.0.1", port, 0, 3, milliseconds(5000));
  TcpStore first("127.0.0.1", port, 1, 3, milliseconds(5000));
  try {
    TcpStore second("127.0.0.1", port, 1, 3, milliseconds(5000));
    FAIL() << "two processes cannot both be rank 1";
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=1"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ClientLearnsWhenTheMasterGoesAway) {
  const int port = test::free_port();
  auto master = std::make_unique<TcpStore>("127.0.0.1", port, 0, 2, milliseconds(5000));
  TcpStore client("127.0.0.1", port, 1, 2, milliseconds(5000));
  master->close(milliseconds(100));  // gives up waiting for the client's goodbye
  master.reset();
  EXPECT_THROW(client.wait({"never"}, milliseconds(2000)), CommError);
}

TEST(TcpStore, GarbageFromAStrangerDoesNotHurtTheStore) {
  const int port = test::free_port();
  TcpStore master("127.0.0.1", port, 0, 1, milliseconds(5000));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const char junk[] = "\xff\xff\xff\x7fGET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::send(fd, junk, sizeof(junk), MSG_NOSIGNAL), 0);
  char buf[16];
  EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);  // the server hangs up on it
  ::close(fd);
  master.set("still", bytes("works"));
  EXPECT_EQ(master.get("still"), bytes("works"));
}

// The request handling on bytes alone (tcp_store_service.h): what the socket loop relies on.
std::vector<uint8_t> frame(uint8_t op, const std::vector<uint8_t>& fields) {
  std::vector<uint8_t> out;
  const auto n = static_cast<uint32_t>(1 + fields.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.push_back(op);
  out.insert(out.end(), fields.begin(), fields.end());
  return out;
}

std::vector<uint8_t> field(const std::string& s) {
  std::vector<uint8_t> out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(s.size() >> (8 * i)));
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

std::vector<uint8_t> hello(int32_t rank, int32_t world_size) {
  std::vector<uint8_t> fields;
  for (int32_t v : {rank, world_size}) {
    for (int i = 0; i < 4; ++i) fields.push_back(static_cast<uint8_t>(uint32_t(v) >> (8 * i)));
  }
  return frame(1, fields);
}

TEST(TcpStoreService, HandlesAFrameOnlyOnceItIsComplete) {
  TcpStoreService service("127.0.0.1:1", 2);
  TcpStoreService::Connection c;
  std::vector<uint8_t> bytes = hello(1, 2);
  std::vector<uint8_t> fields = field("key");
  const auto value = field("value");
  fields.insert(fields.end(), value.begin(), value.end());
  const auto set = frame(2, fields);
  // Lengths of the two frames' bodies are little endian u32s; set's is 1 + 7 + 9 = 17.
  ASSERT_EQ(set[0], 17);
  bytes.insert(bytes.end(), set.begin(), set.end());
  for (size_t i = 0; i < bytes.size(); ++i) {  // one byte at a time, as recv() may deliver them
    c.in.push_back(bytes[i]);
    ASSERT_TRUE(service.process_frames(c)) << "after byte " << i;
    const size_t replies = c.out.size() / 5;  // each reply is a 5-byte status frame here
    EXPECT_EQ(replies, i + 1 < 13 ? 0u : (i + 1 < bytes.size() ? 1u : 2u)) << "after byte " << i;
  }
  EXPECT_EQ(c.rank, 1);
  EXPECT_TRUE(c.in.empty());
  EXPECT_EQ(service.key_count(), 1u);
  EXPECT_EQ(service.stored_bytes(), 3u + 5u);
}

TEST(TcpStoreService, DropsBadFramesAndRequestsBeforeHello) {
  TcpStoreService service("127.0.0.1:1", 2);
  {
    TcpStoreService::Connection c;
    c.in = frame(3, field("key"));  // GET before HELLO
    EXPECT_FALSE(service.process_frames(c));
    EXPECT_TRUE(c.dead);
    EXPECT_TRUE(c.out.empty());
  }
  {
    TcpStoreService::Connection c;
    const uint32_t n = TcpStoreService::kMaxFrameBytes + 1;  // over the bound: not even read
    for (int i = 0; i < 4; ++i) c.in.push_back(static_cast<uint8_t>(n >> (8 * i)));
    EXPECT_FALSE(service.process_frames(c));
  }
  {
    TcpStoreService::Connection c;
    c.in = hello(0, 2);
    const auto bad = frame(2, {0xff, 0xff, 0xff, 0x7f});  // a key longer than its frame
    c.in.insert(c.in.end(), bad.begin(), bad.end());
    EXPECT_FALSE(service.process_frames(c));
    EXPECT_EQ(c.out.size(), 5u);  // the HELLO's reply only
    EXPECT_EQ(service.key_count(), 0u);
  }
}

}  // namespace
}  // namespace dgc::comm
