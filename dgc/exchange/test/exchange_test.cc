// The DGC exchange with ranks as threads (run_local): the exchanged updates equal the directly
// computed sum over ranks / N (colliding indices included, dense path too) for world sizes
// 1..8; the byte accounting has its closed form; the handshake names every kind of mismatch;
// a corrupt message names its sender.
#include "dgc/exchange/exchange.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "dgc/comm/launch.h"
#include "dgc/comm/wire_bytes.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/exchange/test/exchange_fixture.h"

namespace dgc {
namespace {

using std::chrono::milliseconds;
using test::model_layout;
using test::rank_inputs;

comm::GlooOptions quick() {
  comm::GlooOptions options;
  options.timeout = milliseconds(10000);
  return options;
}

// Only compressed tensors: no dense-path allreduce.
std::vector<TensorSpec> compressed_only_layout() {
  PolicyOptions policy;
  policy.min_numel = 1024;
  return make_layout({{"conv.weight", {16, 8, 3, 3}}, {"fc.weight", {10, 300}}}, policy);
}

ExchangeOptions exchange_options(ValueType type = ValueType::kFloat32) {
  ExchangeOptions options;
  options.value_type = type;
  options.timeout = milliseconds(10000);
  options.settings = "density=0.001\nmomentum=0.9\n";
  return options;
}

// The size of every rank's message at `iteration`, encoded here the way the exchange does
// (the two compressed tensors of 1152 and 3000 elements).
std::vector<uint64_t> encoded_sizes(const std::vector<TensorSpec>& layout, int n,
                                    uint64_t iteration, ValueType type) {
  std::vector<uint64_t> sizes(n);
  for (int r = 0; r < n; ++r) {
    const auto in = rank_inputs(layout, r, iteration);
    MessageWriter writer(type, iteration);
    writer.add(0, 1152, in.selections[0].indices, in.selections[0].values);
    writer.add(1, 3000, in.selections[1].indices, in.selections[1].values);
    std::vector<uint8_t> message;
    writer.finish(message);
    sizes[r] = message.size();
  }
  return sizes;
}

TEST(Layout, PolicyChoosesThePathAndKeepsTheOrder) {
  const auto layout = model_layout();
  ASSERT_EQ(layout.size(), 5u);
  EXPECT_EQ(layout[0].name, "conv.weight");
  EXPECT_EQ(layout[0].numel(), 1152);
  EXPECT_EQ(layout[0].path, TensorPath::kCompressed);
  EXPECT_EQ(layout[1].path, TensorPath::kDense);
  EXPECT_EQ(layout[2].path, TensorPath::kCompressed);
  EXPECT_EQ(layout[3].path, TensorPath::kDense);
  EXPECT_EQ(layout[4].path, TensorPath::kDense);
  const TensorSpec scalar{"scalar", {}, TensorPath::kDense};
  EXPECT_EQ(scalar.numel(), 1);
}

// ---- the exchange over world sizes, value types ----

struct Case {
  int world_size;
  ValueType value_type;
};

class ExchangeTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExchangeTest, UpdatesAreTheSumOverRanksDividedByN) {
  const auto [n, type] = GetParam();
  const auto layout = model_layout();
  std::mutex mutex;
  std::vector<std::vector<std::vector<float>>> results(n);  // rank -> tensor -> values
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options(type));
    ASSERT_EQ(exchange.compressed_tensors(), (std::vector<size_t>{0, 2}));
    ASSERT_EQ(exchange.dense_tensors(), (std::vector<size_t>{1, 3, 4}));
    std::vector<std::vector<float>> updates = {std::vector<float>(1152, 99.0f),
                                               std::vector<float>(3000, 99.0f)};
    const auto update_spans = test::spans(updates);
    for (uint64_t it = 0; it < 3; ++it) {
      auto in = rank_inputs(layout, comm.rank(), it);
      const int flagged = exchange.run(it, in.selections, update_spans, in.dense);
      ASSERT_EQ(flagged, 0);
      const auto expected = test::expected_result(layout, n, it);
      EXPECT_LE(test::max_error(expected, updates, in.dense), 1e-6)
          << "rank " << comm.rank() << " iteration " << it;
    }
    std::lock_guard lock(mutex);
    results[comm.rank()] = updates;
  });
  // Every rank decodes the same messages in the same order: identical bits everywhere.
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r;
}

TEST_P(ExchangeTest, BytesHaveTheirClosedForm) {
  const auto [n, type] = GetParam();
  const auto layout = model_layout();
  const uint64_t dense_numel = 16 + 10 + 16;
  const uint64_t total_numel = 1152 + 3000 + dense_numel;
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options(type));
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    ExchangeBytes sum;
    for (uint64_t it = 0; it < 2; ++it) {
      // Every rank's message, encoded here the way the exchange does.
      const std::vector<uint64_t> sizes = encoded_sizes(layout, n, it, type);
      auto in = rank_inputs(layout, comm.rank(), it);
      exchange.run(it, in.selections, test::spans(updates), in.dense);
      const auto& b = exchange.last();
      EXPECT_EQ(b.message, sizes[comm.rank()] + 4 * dense_numel);
      EXPECT_EQ(b.dense_gradient, 4 * total_numel);
      const auto gather = comm::ring_allgatherv_bytes(sizes, comm.rank());
      const auto flags = comm::ring_allreduce_bytes(4 * (dense_numel + 1), n);
      const uint64_t size_exchange = n > 1 ? 8 * static_cast<uint64_t>(n - 1) : 0;
      EXPECT_EQ(b.wire_sent, size_exchange + gather.sent + flags.sent);
      EXPECT_EQ(b.wire_received, size_exchange + gather.received + flags.received);
      EXPECT_EQ(b.dense_wire_sent, n > 1 ? 2 * (n - 1) * 4 * total_numel / n : 0);
      sum += b;
    }
    EXPECT_EQ(exchange.total().message, sum.message);
    EXPECT_EQ(exchange.total().wire_sent, sum.wire_sent);
    EXPECT_EQ(exchange.total().dense_gradient, 2 * 4 * total_numel);
  });
}

TEST_P(ExchangeTest, ABadGradientOnOneRankIsCountedOnEveryRank) {
  const auto [n, type] = GetParam();
  const auto layout = model_layout();
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options(type));
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    for (uint64_t it = 0; it < 3; ++it) {
      auto in = rank_inputs(layout, comm.rank(), it);
      const bool ok = !(it == 1 && comm.rank() == n - 1);
      EXPECT_EQ(exchange.run(it, in.selections, test::spans(updates), in.dense, ok),
                it == 1 ? 1 : 0);
      if (it != 1) {
        EXPECT_LE(test::max_error(test::expected_result(layout, n, it), updates, in.dense), 1e-6);
      }
    }
  });
}

// Iterations with different selections into the same buffers: exactly the direct sum / N at
// the selected positions and exactly 0 everywhere else, also when the buffers change between
// calls (full zeroing) or the caller wrote into them after forget_updates().
TEST_P(ExchangeTest, ReusedBuffersHoldOnlyThisIterationsSum) {
  const auto [n, type] = GetParam();
  for (const auto& layout : {model_layout(), compressed_only_layout()}) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      Exchange exchange(comm, layout, exchange_options(type));
      std::vector<std::vector<float>> first = {std::vector<float>(1152, 99.0f),
                                               std::vector<float>(3000, 99.0f)};
      std::vector<std::vector<float>> second = first;
      for (uint64_t it = 0; it < 6; ++it) {
        // Iterations 0-1 and 4-5 use `first`, 2-3 use `second` (a change of buffers).
        auto& updates = it == 2 || it == 3 ? second : first;
        if (it == 5) {
          for (auto& u : updates) std::fill(u.begin(), u.end(), -7.0f);
          exchange.forget_updates();
        }
        auto in = rank_inputs(layout, comm.rank(), it);
        ASSERT_EQ(exchange.run(it, in.selections, test::spans(updates), in.dense), 0);
        const auto expected = test::expected_result(layout, n, it);
        std::vector<std::vector<bool>> selected(updates.size());
        for (size_t c = 0; c < updates.size(); ++c) selected[c].resize(updates[c].size());
        for (int r = 0; r < n; ++r) {
          const auto theirs = rank_inputs(layout, r, it);
          for (size_t c = 0; c < updates.size(); ++c) {
            for (uint32_t index : theirs.selections[c].indices) selected[c][index] = true;
          }
        }
        for (size_t c = 0; c < updates.size(); ++c) {
          for (size_t i = 0; i < updates[c].size(); ++i) {
            if (!selected[c][i]) {
              ASSERT_EQ(updates[c][i], 0.0f) << "tensor " << c << " index " << i << " iteration "
                                             << it << " rank " << comm.rank();
            } else {
              ASSERT_NEAR(updates[c][i], expected.updates[c][i], 1e-6)
                  << "tensor " << c << " index " << i << " iteration " << it;
            }
          }
        }
      }
    });
  }
}

// Without dense-path tensors the flag travels as one byte after the message and no allreduce
// runs; every rank still gets the same count.
TEST_P(ExchangeTest, WithoutDenseTensorsTheFlagTravelsInTheMessage) {
  const auto [n, type] = GetParam();
  const auto layout = compressed_only_layout();
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options(type));
    ASSERT_TRUE(exchange.dense_tensors().empty());
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    for (uint64_t it = 0; it < 4; ++it) {
      std::vector<uint64_t> sizes = encoded_sizes(layout, n, it, type);
      for (auto& size : sizes) size += 1;  // the flag byte
      auto in = rank_inputs(layout, comm.rank(), it);
      // Iteration 1: the last rank flags; iteration 2: every rank flags.
      const bool ok = !(it == 1 && comm.rank() == n - 1) && it != 2;
      const int flagged = exchange.run(it, in.selections, test::spans(updates), in.dense, ok);
      EXPECT_EQ(flagged, it == 1 ? 1 : it == 2 ? n : 0) << "iteration " << it;
      if (flagged == 0) {
        EXPECT_LE(test::max_error(test::expected_result(layout, n, it), updates, in.dense), 1e-6);
      }
      const auto& b = exchange.last();
      EXPECT_EQ(b.message, sizes[comm.rank()]);
      const auto gather = comm::ring_allgatherv_bytes(sizes, comm.rank());
      const uint64_t size_exchange = n > 1 ? 8 * static_cast<uint64_t>(n - 1) : 0;
      EXPECT_EQ(b.wire_sent, size_exchange + gather.sent);
      EXPECT_EQ(b.wire_received, size_exchange + gather.received);
    }
  });
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int n : {1, 2, 3, 4, 8}) out.push_back({n, ValueType::kFloat32});
  out.push_back({3, ValueType::kFloat16});
  out.push_back({4, ValueType::kBFloat16});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& param_info) {
  const char* names[] = {"fp32", "fp16", "bf16"};
  return "n" + std::to_string(param_info.param.world_size) + "_" +
         names[static_cast<int>(param_info.param.value_type)];
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ExchangeTest, ::testing::ValuesIn(cases()), case_name);

TEST(Exchange, RejectsArgumentsThatDoNotMatchTheLayout) {
  const auto layout = model_layout();
  comm::run_local(1, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options());
    auto in = rank_inputs(layout, 0, 0);
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    std::vector<std::vector<float>> short_updates = {std::vector<float>(1152),
                                                     std::vector<float>(2999)};
    EXPECT_THROW(exchange.run(0, std::span(in.selections).first(1), test::spans(updates), in.dense),
                 InvalidArgument);
    EXPECT_THROW(exchange.run(0, in.selections, test::spans(short_updates), in.dense),
                 InvalidArgument);
    in.dense.pop_back();
    EXPECT_THROW(exchange.run(0, in.selections, test::spans(updates), in.dense), InvalidArgument);
  });
}

// ---- handshake ----

// Runs the handshake on 4 ranks where `vary(rank, layout, settings)` may change one rank's view;
// returns each rank's MismatchError message ("" if none).
std::vector<std::string> handshake_errors(
    const std::function<void(int, std::vector<TensorSpec>&, std::string&)>& vary) {
  constexpr int n = 4;
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    auto layout = model_layout();
    std::string settings = "density=0.001\nmomentum=0.9\nnesterov=false\n";
    vary(comm.rank(), layout, settings);
    try {
      handshake(comm, layout, settings, milliseconds(10000));
    } catch (const MismatchError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  return errors;
}

void expect_same_error_everywhere(const std::vector<std::string>& errors,
                                  const std::vector<std::string>& parts) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_EQ(errors[r], errors[0]) << "rank " << r << " reports a different message";
  }
  for (const auto& part : parts) {
    EXPECT_NE(errors[0].find(part), std::string::npos) << "missing '" << part << "' in\n"
                                                       << errors[0];
  }
}

TEST(Handshake, AgreementPasses) {
  const auto errors = handshake_errors([](int, auto&, auto&) {});
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Handshake, ShapeMismatchNamesTensorRanksAndBothShapes) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 2) layout = model_layout(299);
  });
  expect_same_error_everywhere(
      errors, {"tensor 2 ('fc.weight')", "rank 0 has 'fc.weight' shape [10, 300] path compressed",
               "rank 2 has 'fc.weight' shape [10, 299] path compressed"});
}

TEST(Handshake, SettingMismatchNamesTheKeyRanksAndBothValues) {
  const auto errors = handshake_errors([](int rank, auto&, auto& settings) {
    if (rank == 1 || rank == 3) settings = "density=0.01\nmomentum=0.9\nnesterov=false\n";
  });
  expect_same_error_everywhere(
      errors, {"setting 'density'", "rank 0 has '0.001'", "ranks 1, 3 have '0.01'"});
}

TEST(Handshake, MissingSettingIsNamed) {
  const auto errors = handshake_errors([](int rank, auto&, auto& settings) {
    if (rank == 3) settings = "density=0.001\nmomentum=0.9\n";
  });
  expect_same_error_everywhere(
      errors, {"setting 'nesterov'", "rank 0 has 'false'", "rank 3 has (not set)"});
}

TEST(Handshake, OrderMismatchIsNamed) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 1) std::swap(layout[1], layout[3]);
  });
  expect_same_error_everywhere(errors, {"tensor 1 ('conv.bias')", "rank 1 has 'fc.bias'"});
}

TEST(Handshake, PathMismatchIsNamed) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 2) layout[0].path = TensorPath::kDense;
  });
  expect_same_error_everywhere(errors, {"tensor 0 ('conv.weight')", "path compressed",
                                        "rank 2 has 'conv.weight' shape [16, 8, 3, 3] path dense"});
}

TEST(Handshake, ExtraTensorIsNamed) {
  const auto errors = handshake_errors([](int rank, auto& layout, auto&) {
    if (rank == 0) layout.push_back(TensorSpec{"extra", {3}, TensorPath::kDense});
  });
  expect_same_error_everywhere(errors,
                               {"the number of tensors", "rank 0 has 6", "ranks 1, 2, 3 have 5"});
}

TEST(Handshake, ValueTypeIsPartOfTheAgreement) {
  constexpr int n = 2;
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    try {
      Exchange exchange(
          comm, model_layout(),
          exchange_options(comm.rank() == 0 ? ValueType::kFloat32 : ValueType::kFloat16));
    } catch (const MismatchError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  expect_same_error_everywhere(errors, {"setting 'exchange.value_type'", "'fp32'", "'fp16'"});
}

// ---- a corrupt or out-of-step message ----

// Forwards to a real communicator; when armed, flips one payload byte of rank `victim`'s
// message in what allgatherv returns, as a faulty link or peer would.
class CorruptingCommunicator final : public comm::Communicator {
 public:
  CorruptingCommunicator(comm::Communicator& inner, int victim) : inner_(inner), victim_(victim) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  std::vector<std::vector<uint8_t>> allgatherv(std::span<const uint8_t> message,
                                               comm::Timeout timeout) override {
    auto all = inner_.allgatherv(message, timeout);
    if (armed && all[victim_].size() > 40) {
      if (flip_last) {
        all[victim_].back() ^= 0x5A;
      } else {
        all[victim_][40] ^= 0x5A;
      }
    }
    return all;
  }
  void allreduce_sum(std::span<float> values, comm::Timeout timeout) override {
    inner_.allreduce_sum(values, timeout);
  }
  void broadcast(std::span<uint8_t> data, int root, comm::Timeout timeout) override {
    inner_.broadcast(data, root, timeout);
  }
  void barrier(comm::Timeout timeout) override { inner_.barrier(timeout); }
  bool armed = false;
  bool flip_last = false;  // flip the last byte instead of byte 40

 private:
  comm::Communicator& inner_;
  int victim_;
};

TEST(Exchange, CorruptMessageIsADecodeErrorNamingTheSender) {
  constexpr int n = 3;
  const auto layout = model_layout();
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& real) {
    CorruptingCommunicator comm(real, 2);
    Exchange exchange(comm, layout, exchange_options());
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    auto in = rank_inputs(layout, comm.rank(), 0);
    comm.armed = true;
    try {
      exchange.run(0, in.selections, test::spans(updates), in.dense);
    } catch (const DecodeError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("message from rank 2 of 3"), std::string::npos) << errors[r];
  }
}

// Without dense-path tensors the bad-gradient flag travels in the message: a corrupt message is
// still named by its sender, and nothing is written into the updates.
TEST(Exchange, CorruptMessageWithoutDenseTensorsWritesNothing) {
  constexpr int n = 3;
  const auto layout = compressed_only_layout();
  for (const bool flip_last : {false, true}) {
    std::vector<std::string> errors(n);
    comm::run_local(n, quick(), [&](comm::Communicator& real) {
      CorruptingCommunicator comm(real, 2);
      comm.flip_last = flip_last;
      Exchange exchange(comm, layout, exchange_options());
      std::vector<std::vector<float>> updates = {std::vector<float>(1152),
                                                 std::vector<float>(3000)};
      auto in = rank_inputs(layout, comm.rank(), 0);
      ASSERT_EQ(exchange.run(0, in.selections, test::spans(updates), in.dense), 0);
      const auto before = updates;
      comm.armed = true;
      in = rank_inputs(layout, comm.rank(), 1);
      try {
        exchange.run(1, in.selections, test::spans(updates), in.dense);
      } catch (const DecodeError& e) {
        errors[comm.rank()] = e.what();
      }
      EXPECT_EQ(updates, before) << "rank " << comm.rank();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_NE(errors[r].find("message from rank 2 of 3"), std::string::npos) << errors[r];
      if (flip_last) {
        EXPECT_NE(errors[r].find("bad-gradient flag"), std::string::npos) << errors[r];
      }
    }
  }
}

TEST(Exchange, RanksOutOfStepAreAnError) {
  constexpr int n = 2;
  const auto layout = model_layout();
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    Exchange exchange(comm, layout, exchange_options());
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    const uint64_t it = comm.rank() == 1 ? 8 : 7;
    auto in = rank_inputs(layout, comm.rank(), it);
    try {
      exchange.run(it, in.selections, test::spans(updates), in.dense);
    } catch (const DecodeError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 1 is for iteration 8 but this rank is at iteration 7"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0 is for iteration 7 but this rank is at iteration 8"),
            std::string::npos)
      << errors[1];
}

TEST(Exchange, StalledRankEndsInACommErrorWithinTheTimeout) {
  constexpr int n = 3;
  const auto layout = model_layout();
  std::vector<int> failed(n, 0);
  std::atomic<int> done{0};
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    auto options = exchange_options();
    options.timeout = milliseconds(1000);
    Exchange exchange(comm, layout, options);
    if (comm.rank() == 1) {  // stops participating
      for (int i = 0; i < 1000 && done.load() < n - 1; ++i) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      return;
    }
    std::vector<std::vector<float>> updates = {std::vector<float>(1152), std::vector<float>(3000)};
    auto in = rank_inputs(layout, comm.rank(), 0);
    const auto start = std::chrono::steady_clock::now();
    try {
      exchange.run(0, in.selections, test::spans(updates), in.dense);
    } catch (const CommError&) {
      failed[comm.rank()] = 1;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000 + 3000));
    done.fetch_add(1);
  });
  EXPECT_EQ(failed[0], 1);
  EXPECT_EQ(failed[2], 1);
}

// ---- broadcast_parameters ----

TEST(BroadcastParameters, EveryRankEndsWithRankZerosValues) {
  for (int n : {1, 2, 3, 5}) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      std::vector<float> a(1000), b(7), empty;
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(comm.rank() * 10000 + i);
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(-comm.rank() - 1);
      std::vector<std::span<float>> params = {a, empty, b};
      broadcast_parameters(comm, params);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], static_cast<float>(i));
      for (float v : b) ASSERT_EQ(v, -1.0f);
    });
  }
}

TEST(BroadcastParameters, DifferentModelSizesAreAMismatch) {
  std::vector<int> mismatches(2, 0);
  comm::run_local(2, quick(), [&](comm::Communicator& comm) {
    std::vector<float> a(comm.rank() == 0 ? 10 : 11);
    std::vector<std::span<float>> params = {a};
    try {
      broadcast_parameters(comm, params);
    } catch (const MismatchError&) {
      mismatches[comm.rank()] = 1;
    }
  });
  EXPECT_EQ(mismatches, (std::vector<int>{1, 1}));
}

}  // namespace
}  // namespace dgc
