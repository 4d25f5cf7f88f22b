// The dense path (exchange.h, at the top): the tensors the policy does not compress travel
// fused in one flat buffer per rank, once per iteration, and every rank ends with their sum.
//   fp32, no job key:       one Communicator::allreduce_sum of the buffer;
//   16-bit values:          every rank's buffer as fp16 / bf16 values through one allgatherv
//                           (the caller rounded with error feedback first, so the conversion
//                           loses nothing more), summed in fp32 in rank order on every rank;
//   with a job key:         the same allgatherv (fp32 or 16-bit), every buffer followed by its
//                           tag over the run id, the iteration and the sender, verified before
//                           anything is summed (a ring allreduce's partial sums cannot be tagged).
//
// Collective: every rank calls it in the same iteration with the same options and buffer size.
#pragma once

#include <cstdint>
#include <span>

#include "dgc/comm/communicator.h"
#include "dgc/core/options.h"
#include "dgc/exchange/context.h"

namespace dgc {

// Every member refers to the caller's objects, which must outlive the call.
struct DensePathOptions {
  comm::Communicator& comm;
  const JobIdentity& job;
  ValueType value_type;  // on the wire (ExchangeOptions::dense_value_type)
  comm::Timeout timeout;
  uint64_t iteration;
};

// Replaces `dense_flat` (this rank's dense-path gradients, concatenated) by their sum over ranks
// (not yet divided by N). On the allgatherv paths every rank's buffer is checked (size, tag,
// finite values) before anything is written. Returns the bytes this rank's buffer carried besides
// its values: kTagBytes with a job key, else 0. Throws dgc::CommError, dgc::DecodeError (naming the
// sender).
uint64_t sum_dense_path(const DensePathOptions& options, std::span<float> dense_flat);

}  // namespace dgc
