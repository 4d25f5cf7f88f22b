// Job identity and authentication in the exchange, ranks as threads, on every algorithm
// (allgather, direct, sparse-allreduce): every rank learns one run id at the handshake; a
// message of another job is refused; with a job key the exchange gives the reference result,
// and a message or dense-path buffer without a valid tag (stripped, forged, another key) is
// refused on the receiving ranks before anything is written; ranks with different keys (or some
// without one) stop at the handshake.
#include <gtest/gtest.h>

#include <zlib.h>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dgc/comm/launch.h"
#include "dgc/core/auth.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/exchange/exchange.h"
#include "dgc/exchange/test/exchange_fixture.h"

namespace dgc {
namespace {

using std::chrono::milliseconds;
using test::model_layout;
using test::rank_inputs;

constexpr ExchangeAlgorithm kAlgorithms[] = {
    ExchangeAlgorithm::kAllgather, ExchangeAlgorithm::kDirect, ExchangeAlgorithm::kSparseAllreduce};

comm::GlooOptions quick() {
  comm::GlooOptions options;
  options.timeout = milliseconds(10000);
  return options;
}

MacKey key_of(uint8_t seed) {
  MacKey key{};
  key.fill(seed);
  return key;
}

ExchangeOptions options_for(ExchangeAlgorithm a, std::optional<MacKey> key) {
  ExchangeOptions options;
  options.timeout = milliseconds(10000);
  options.settings = "density=0.001\nmomentum=0.9\n";
  options.algorithm = a;
  options.message_key = key;
  return options;
}

uint32_t crc(const uint8_t* data, size_t size) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(size)));
}

bool is_codec_message(const std::vector<uint8_t>& m) {
  return m.size() >= kMessageHeaderBytes && std::memcmp(m.data(), "DGC1", 4) == 0;
}

// Header and payload checksums recomputed after an edit, as a stranger who knows the format (but
// not the key) would. `tag_bytes`: the trailer after the payload.
void fix_checksums(std::vector<uint8_t>& m, size_t tag_bytes) {
  const size_t payload = m.size() - kMessageHeaderBytes - tag_bytes;
  const uint32_t payload_bytes = static_cast<uint32_t>(payload);
  std::memcpy(m.data() + 20, &payload_bytes, 4);
  const uint32_t payload_crc = crc(m.data() + kMessageHeaderBytes, payload);
  std::memcpy(m.data() + 24, &payload_crc, 4);
  const uint32_t header_crc = crc(m.data(), 44);
  std::memcpy(m.data() + 44, &header_crc, 4);
}

// Forwards to a real communicator; when armed, edits what allgatherv / alltoallv return from
// rank `victim` (what a stranger on the path, or a peer of another job, would put there).
class TamperingCommunicator final : public comm::ForwardingCommunicator {
 public:
  using Edit = std::function<void(std::vector<uint8_t>&)>;
  TamperingCommunicator(comm::Communicator& inner, int victim, Edit edit)
      : ForwardingCommunicator(inner), victim_(victim), edit_(std::move(edit)) {}
  bool armed = false;

 protected:
  void on_delivered(const char*, std::vector<std::vector<uint8_t>>& all) override {
    if (armed) edit_(all[victim_]);
  }

 private:
  int victim_;
  Edit edit_;
};

struct Outcome {
  std::string error;  // "" if run() returned
  std::optional<DecodeError::Reason> reason;
  bool untouched = true;  // the updates are as before the failed run
};

// One clean iteration, then one with rank 2's incoming messages edited by `edit` on every rank;
// returns what each rank saw in the second.
std::vector<Outcome> run_tampered(ExchangeAlgorithm a, std::optional<MacKey> key,
                                  const TamperingCommunicator::Edit& edit,
                                  const std::vector<TensorSpec>& layout = model_layout()) {
  constexpr int n = 3;
  std::vector<Outcome> outcomes(n);
  comm::run_local(n, quick(), [&](comm::Communicator& real) {
    TamperingCommunicator comm(real, 2, edit);
    Exchange exchange(comm, layout, options_for(a, key));
    std::vector<std::vector<float>> updates;
    for (size_t c : exchange.compressed_tensors()) updates.emplace_back(layout[c].numel());
    auto in = rank_inputs(layout, comm.rank(), 0);
    std::vector<Selection> unapplied(in.selections.size());
    ASSERT_EQ(exchange.run(0, in.selections, test::spans(updates), in.dense, true, unapplied), 0);
    const auto before = updates;
    in = rank_inputs(layout, comm.rank(), 1);
    const auto dense_before = in.dense;
    comm.armed = true;
    Outcome& out = outcomes[comm.rank()];
    try {
      exchange.run(1, in.selections, test::spans(updates), in.dense, true, unapplied);
    } catch (const DecodeError& e) {
      out.error = e.what();
      out.reason = e.reason();
    } catch (const CommError& e) {
      out.error = std::string("CommError: ") + e.what();
    }
    out.untouched = updates == before && in.dense == dense_before;
  });
  return outcomes;
}

// Every rank refuses rank 2's message for `reason`, names the sender and applies nothing.
void expect_refused_everywhere(const std::vector<Outcome>& outcomes, DecodeError::Reason reason,
                               const std::string& part, ExchangeAlgorithm a) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    const Outcome& o = outcomes[r];
    EXPECT_EQ(o.reason, reason) << to_string(a) << ", rank " << r << ": " << o.error;
    EXPECT_NE(o.error.find("from rank 2 of 3"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find(part), std::string::npos) << o.error;
    EXPECT_TRUE(o.untouched) << to_string(a) << ", rank " << r << " applied something";
  }
}

TEST(ExchangeIdentity, EveryRankLearnsRankZerosRunIdAndEachJobHasItsOwn) {
  constexpr int n = 3;
  std::vector<RunId> ids(2 * n);
  for (int job = 0; job < 2; ++job) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      Exchange exchange(comm, model_layout(), options_for(ExchangeAlgorithm::kAllgather, {}));
      ids[job * n + comm.rank()] = exchange.run_id();
      EXPECT_FALSE(exchange.authenticated());
    });
  }
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(ids[r], ids[0]);
    EXPECT_EQ(ids[n + r], ids[n]);
  }
  EXPECT_NE(ids[0], ids[n]) << "two jobs drew the same run id";
  EXPECT_NE(ids[0], RunId{});
}

// A message of another job (its run id, checksums repaired) is refused on every algorithm.
TEST(ExchangeIdentity, AMessageOfAnotherJobIsRefusedOnEveryAlgorithm) {
  for (const ExchangeAlgorithm a : kAlgorithms) {
    const auto outcomes = run_tampered(a, std::nullopt, [](std::vector<uint8_t>& m) {
      if (!is_codec_message(m)) return;
      m[28] ^= 0x01;  // the first byte of the run id
      fix_checksums(m, 0);
    });
    expect_refused_everywhere(outcomes, DecodeError::Reason::kForeignRun, "from another job", a);
  }
}

TEST(ExchangeAuthentication, WithAKeyEveryAlgorithmGivesTheReferenceResult) {
  constexpr int n = 3;
  const auto layout = model_layout();
  for (const ExchangeAlgorithm a : kAlgorithms) {
    comm::run_local(n, quick(), [&](comm::Communicator& comm) {
      Exchange exchange(comm, layout, options_for(a, key_of(7)));
      EXPECT_TRUE(exchange.authenticated());
      std::vector<std::vector<float>> updates;
      for (size_t c : exchange.compressed_tensors()) updates.emplace_back(layout[c].numel());
      std::vector<Selection> unapplied(updates.size());
      for (uint64_t it = 0; it < 3; ++it) {
        auto in = rank_inputs(layout, comm.rank(), it);
        ASSERT_EQ(exchange.run(it, in.selections, test::spans(updates), in.dense, true, unapplied),
                  0);
        std::string first;
        EXPECT_EQ(test::check_against_reference(comm, layout, it, test::Pattern::kColliding,
                                                unapplied, updates, ValueType::kFloat32, first),
                  0)
            << to_string(a) << ": " << first;
        const auto expected = test::expected_result(layout, n, it);
        for (size_t j = 0; j < expected.dense.size(); ++j) {
          EXPECT_NEAR(in.dense[j], expected.dense[j], 1e-6) << j;
        }
        // Every message carries a tag, and so does the dense path.
        const ExchangeBytes& b = exchange.last();
        const uint64_t messages = a == ExchangeAlgorithm::kSparseAllreduce ? n : 1;
        EXPECT_EQ(b.message_headers, messages * (kMessageHeaderBytes + kTagBytes) + kTagBytes);
        EXPECT_EQ(b.message, b.message_compressed + b.message_dense_path + b.message_headers);
      }
    });
  }
}

TEST(ExchangeAuthentication, AnUntaggedMessageIsRefusedOnEveryAlgorithm) {
  for (const ExchangeAlgorithm a : kAlgorithms) {
    // The tag stripped and the flag cleared, checksums repaired: a stranger without the key.
    const auto outcomes = run_tampered(a, key_of(7), [](std::vector<uint8_t>& m) {
      if (!is_codec_message(m) || !(m[6] & kFlagTagged)) return;
      m.resize(m.size() - kTagBytes);
      m[6] &= static_cast<uint8_t>(~kFlagTagged);
      fix_checksums(m, 0);
    });
    expect_refused_everywhere(outcomes, DecodeError::Reason::kBadTag, "no authentication tag", a);
  }
}

TEST(ExchangeAuthentication, AForgedMessageIsRefusedOnEveryAlgorithm) {
  for (const ExchangeAlgorithm a : kAlgorithms) {
    // A payload byte (or, for an empty message, the iteration's neighbour in the header, the
    // flags) changed with the checksums repaired: only the tag can tell.
    const auto outcomes = run_tampered(a, key_of(7), [](std::vector<uint8_t>& m) {
      if (!is_codec_message(m)) return;
      if (m.size() > kMessageHeaderBytes + kTagBytes) {
        m[kMessageHeaderBytes] ^= 0x01;  // the first tensor id
      } else {
        m[6] ^= kFlagBadGradient;
      }
      fix_checksums(m, kTagBytes);
    });
    expect_refused_everywhere(outcomes, DecodeError::Reason::kBadTag, "does not verify", a);
  }
}

TEST(ExchangeAuthentication, AMessageTaggedUnderAnotherKeyIsRefused) {
  const MessageAuthenticator stranger(key_of(8));
  for (const ExchangeAlgorithm a : kAlgorithms) {
    // Re-tagged by someone with another key (another job's secret), bound to the right route.
    const auto outcomes = run_tampered(a, key_of(7), [&](std::vector<uint8_t>& m) {
      if (!is_codec_message(m)) return;
      const size_t signed_size = m.size() - kTagBytes;
      uint8_t route[8] = {2, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF};
      const Tag tag = stranger.tag({route, std::span<const uint8_t>(m.data(), signed_size)});
      std::memcpy(m.data() + signed_size, tag.data(), kTagBytes);
    });
    for (const Outcome& o : outcomes) {
      EXPECT_EQ(o.reason, DecodeError::Reason::kBadTag) << to_string(a) << ": " << o.error;
      EXPECT_TRUE(o.untouched);
    }
  }
}

// With a key the dense path is a tagged allgatherv: an altered buffer is refused too.
TEST(ExchangeAuthentication, AForgedDensePathIsRefused) {
  const auto outcomes =
      run_tampered(ExchangeAlgorithm::kAllgather, key_of(7), [](std::vector<uint8_t>& m) {
        if (is_codec_message(m) || m.size() < kTagBytes + 4) return;
        m[0] ^= 0x01;  // the first value's lowest bit
      });
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.reason, DecodeError::Reason::kBadTag) << o.error;
    EXPECT_NE(o.error.find("dense path from rank 2"), std::string::npos) << o.error;
    EXPECT_TRUE(o.untouched);
  }
}

// Runs the handshake on 4 ranks with keys_of(rank); returns each rank's error ("" if none) with
// its type.
std::vector<std::string> handshake_errors(const std::function<std::optional<MacKey>(int)>& key) {
  constexpr int n = 4;
  std::vector<std::string> errors(n);
  comm::run_local(n, quick(), [&](comm::Communicator& comm) {
    const auto mine = key(comm.rank());
    const std::optional<MessageAuthenticator> auth =
        mine ? std::optional<MessageAuthenticator>(*mine) : std::nullopt;
    try {
      handshake(comm, model_layout(), "density=0.001\n", milliseconds(10000),
                auth ? &*auth : nullptr);
    } catch (const AuthenticationError& e) {
      errors[comm.rank()] = std::string("AuthenticationError: ") + e.what();
    } catch (const MismatchError& e) {
      errors[comm.rank()] = std::string("MismatchError: ") + e.what();
    }
  });
  return errors;
}

TEST(ExchangeAuthentication, RanksWithDifferentSecretsStopAtTheHandshake) {
  const auto errors = handshake_errors([](int r) { return key_of(r == 3 ? 9 : 7); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(errors[r].rfind("AuthenticationError: ", 0), 0u) << errors[r];
    EXPECT_NE(errors[r].find("different secrets"), std::string::npos) << errors[r];
  }
  EXPECT_NE(errors[0].find("description of rank 3 does not carry a valid tag"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[3].find("ranks 0, 1, 2"), std::string::npos) << errors[3];
}

TEST(ExchangeAuthentication, RanksOfWhichSomeHaveNoSecretStopAtTheHandshake) {
  const auto errors = handshake_errors(
      [](int r) { return r == 1 ? std::nullopt : std::optional<MacKey>(key_of(7)); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(errors[r],
              "MismatchError: handshake: ranks 0, 2, 3 have a job secret, rank 1 has none; give "
              "every rank the same secret (DGC_JOB_SECRET or --job-secret-file) or none");
  }
}

TEST(ExchangeAuthentication, SameKeysPassTheHandshake) {
  for (const auto& e : handshake_errors([](int) { return key_of(7); })) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace dgc
