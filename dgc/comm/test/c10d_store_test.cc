// libtorch's c10d::TCPStore as the TCP rendezvous (dgc::comm_torch): what use_c10d_store() switches
// on, and the agent store of torchrun. The rest of the comm suite runs without libtorch.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dgc/comm/c10d_store.h"
#include "dgc/comm/launch.h"
#include "dgc/comm/test/test_process.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

using std::chrono::milliseconds;

GlooOptions quick(milliseconds timeout) {
  GlooOptions options;
  options.timeout = timeout;
  return options;
}

class C10dRendezvous : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { use_c10d_store(); }
};

TEST_F(C10dRendezvous, RankZeroServesTheStoreAndTheRanksMeet) {
  ASSERT_TRUE(have_c10d_store());
  const int port = test::free_port();
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = connect_gloo_tcp({"127.0.0.1", port}, r, 3, quick(milliseconds(10000)));
        std::vector<float> values = {static_cast<float>(r + 1)};
        comm->allreduce_sum(values);
        if (values[0] != 6.0f) errors[r] = "wrong sum " + std::to_string(values[0]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", "", ""}));
}

// Two ranks as clients of a store served by someone else, as torchrun's agent serves it: each
// attempt of a restarted run writes under its own prefix, so attempt 1 meets on the same store
// as attempt 0; an attempt that reused attempt 0's keys would find its ranks already claimed.
TEST_F(C10dRendezvous, AgentStoreKeepsTheAttemptsOfARunApart) {
  const int port = test::free_port();
  C10dStore agent({"127.0.0.1", port, false, "agent"}, /*serve=*/true, 0, 1, milliseconds(10000));
  auto attempt = [&](int number) {
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        try {
          const TcpRendezvous where{"127.0.0.1", port, /*agent_store=*/true,
                                    "dgc/job/attempt_" + std::to_string(number)};
          auto comm = connect_gloo_tcp(where, r, 2, quick(milliseconds(3000)));
          std::vector<float> values = {static_cast<float>(r + 1)};
          comm->allreduce_sum(values);
          if (values[0] != 3.0f) errors[r] = "wrong sum";
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  };
  EXPECT_EQ(attempt(0), (std::vector<std::string>{"", ""}));
  EXPECT_EQ(attempt(1), (std::vector<std::string>{"", ""}));
  for (const auto& e : attempt(1)) {
    EXPECT_NE(e.find("two processes were started with RANK="), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace dgc::comm
