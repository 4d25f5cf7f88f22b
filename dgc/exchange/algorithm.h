// Which collective the DGC exchange runs (ExchangeOptions::algorithm, `--exchange`), and the
// rule `auto` uses to pick one. Not collective; no communication.
//
//   allgather         every rank's message to every rank through Communicator::allgatherv (a
//                     ring: N-1 rounds of latency; every rank receives k(N-1) elements).
//   direct            the same messages through Communicator::alltoallv: every rank sends its
//                     message to every other rank at once (one round for the sizes, one for the
//                     payload; on a switched network the same bytes per link as the ring).
//   sparse-allreduce  a split-and-reduce sparse allreduce in the style of Ok-Topk (see
//                     sparse_allreduce.h): every rank receives about 2k(N-1)/N elements instead
//                     of k(N-1); elements a rank selected that the global re-selection did not
//                     apply are handed back to it (Exchange::run's `unapplied`).
//   auto              one of the three, by choose_algorithm() below.
#pragma once

#include <cstdint>
#include <string>

#include "dgc/core/names.h"

namespace dgc {

enum class ExchangeAlgorithm : uint8_t { kAllgather, kDirect, kSparseAllreduce, kAuto };

inline constexpr EnumNames<ExchangeAlgorithm, 4> kExchangeAlgorithmNames = {
    {{ExchangeAlgorithm::kAllgather, "allgather"},
     {ExchangeAlgorithm::kDirect, "direct"},
     {ExchangeAlgorithm::kSparseAllreduce, "sparse-allreduce"},
     {ExchangeAlgorithm::kAuto, "auto"}}};

// "allgather" | "direct" | "sparse-allreduce" | "auto"; dgc::InvalidArgument otherwise.
ExchangeAlgorithm parse_exchange_algorithm(const std::string& name);
const char* to_string(ExchangeAlgorithm algorithm);

// The `auto` rule. Inputs are the same on every rank (the handshake checks them), so every rank
// picks the same algorithm:
//   world_size  N;
//   density     d after warm-up (the expected fraction of elements each rank selects);
//   numel       elements of all compressed tensors together.
// With k = ceil(d * numel) and kBytesPerElement the measured size of one selected element
// (varint index gap + fp32 value), allgather and direct make every rank receive about
// k(N-1) elements (allgather in 2(N-1) rounds, direct in 2), sparse-allreduce about 2k(N-1)/N
// in four rounds:
//   N == 1                                               -> allgather (nothing travels);
//   N >= kSparseMinWorld and
//     k(N-1) * kBytesPerElement >= kSparseMinBytes       -> sparse-allreduce (at N = 8 it
//                                                           receives under 1/3 of the bytes, and
//                                                           the volume is large enough that
//                                                           bytes, not rounds, dominate);
//   otherwise                                            -> direct (one round of latency instead
//                                                           of N-1, the same bytes).
// docs/exchange-benchmark.md has the measurements behind the thresholds.
inline constexpr int kSparseMinWorld = 8;
inline constexpr double kBytesPerElement = 6.0;
inline constexpr double kSparseMinBytes = 1 << 20;
ExchangeAlgorithm choose_algorithm(int world_size, double density, uint64_t numel);

}  // namespace dgc
