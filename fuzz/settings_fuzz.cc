// The settings every rank must agree on: the start-up handshake's description of a rank (binary,
// from a peer: handshake in dgc/exchange/handshake.h), and the "key=value" settings text it and the
// checkpoints carry (parse_key_value_lines in dgc/core/key_value.h, which also reads the
// rendezvous records; describe_settings_difference in dgc/train/checkpoint.h).
//
// Input: the bytes a peer sent in the handshake (a byte saying whether it has a job secret, the
// 16-byte run id field, then its description; the seeds' descriptions follow 17 zero bytes: a
// rank without a secret); the same bytes, as text, are also a settings text.
//
// Promises checked: the handshake throws nothing but dgc::MismatchError, and accepts the peer
// exactly when it sent what this rank sent; parse_key_value_lines gives keys without '=' or
// newline and values without newline; describe_settings_difference is "" exactly when the two
// texts parse to the same settings.
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/error.h"
#include "dgc/core/key_value.h"
#include "dgc/exchange/exchange.h"
#include "dgc/train/checkpoint.h"
#include "fuzz/fuzz_check.h"

namespace {

using dgc::comm::Timeout;

// Rank 0 of two; the allgather returns this rank's bytes and the peer's (the fuzz input). Only
// the handshake's collective is implemented; anything else is a failure of the target.
class PeerCommunicator final : public dgc::comm::Communicator {
 public:
  explicit PeerCommunicator(std::vector<uint8_t> peer)
      : Communicator(Timeout(1000)), peer_(std::move(peer)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "fuzz"; }
  const std::vector<uint8_t>& mine() const { return mine_; }

 protected:
  std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call&) override {
    return {mine, peer_.size()};
  }
  void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                          const Call&) override {
    mine_.assign(flat.begin(), flat.begin() + static_cast<std::ptrdiff_t>(sizes[0]));
    if (!peer_.empty()) std::memcpy(flat.data() + sizes[0], peer_.data(), peer_.size());
  }
  std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t>, const Call&) override {
    std::abort();
  }
  void alltoallv_payload(std::span<const uint8_t>, std::span<const uint64_t>,
                         std::span<const uint64_t>, std::span<uint8_t>, std::span<const uint64_t>,
                         const Call&) override {
    std::abort();
  }
  void allreduce_sum_primitive(std::span<float>, const Call&) override { std::abort(); }
  void broadcast_primitive(std::span<uint8_t>, int, const Call&) override { std::abort(); }
  void barrier_primitive(const Call&) override { std::abort(); }

 private:
  std::vector<uint8_t> peer_;
  std::vector<uint8_t> mine_;
};

const std::vector<dgc::TensorSpec>& layout() {
  static const std::vector<dgc::TensorSpec> specs = {
      {"conv.weight", {8, 3, 3, 3}, dgc::TensorPath::kCompressed},
      {"conv.bias", {8}, dgc::TensorPath::kDense}};
  return specs;
}
const std::string kSettings = "density=0.001\nmomentum=0.9\nnesterov=0\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> peer(data, data + size);

  PeerCommunicator comm(peer);
  const bool agreed = dgc::fuzz::accepted<dgc::MismatchError>(
      [&] { dgc::handshake(comm, layout(), kSettings, Timeout(1000)); });
  // A description that differs only in a setting's spelling (e.g. a line without '=' against
  // one with an empty value) may still agree; the same bytes must.
  if (peer == comm.mine()) FUZZ_CHECK(agreed, "the handshake refused this rank's own description");

  const std::string text(peer.begin(), peer.end());
  const auto settings = dgc::parse_key_value_lines(text);
  for (const auto& [key, value] : settings) {
    FUZZ_CHECK(key.find('=') == std::string::npos && key.find('\n') == std::string::npos,
               "key '%s'", key.c_str());
    FUZZ_CHECK(value.find('\n') == std::string::npos, "value '%s'", value.c_str());
  }
  FUZZ_CHECK(dgc::train::describe_settings_difference(text, text).empty(),
             "a text differs from itself");
  const bool same = settings == dgc::parse_key_value_lines(kSettings);
  FUZZ_CHECK(dgc::train::describe_settings_difference(text, kSettings).empty() == same,
             "describe_settings_difference disagrees with parse_key_value_lines");
  FUZZ_CHECK(dgc::train::describe_settings_difference(kSettings, text).empty() == same,
             "describe_settings_difference is not symmetric in equality");
  return 0;
}
