// The allgather and direct exchanges (ExchangeAlgorithm::kAllgather, kDirect; algorithm.h): this
// rank encodes one message with its selections of every compressed tensor, once, and every rank
// receives every rank's message; every rank then decodes all N of them. The two differ only in
// the collective that carries the messages: Communicator::allgatherv (a ring) for allgather,
// Communicator::alltoallv with the same message to every rank for direct.
//
// Collective: every rank calls it in the same iteration, with the same algorithm.
#pragma once

#include "dgc/exchange/context.h"

namespace dgc {

struct AllgatherOptions {
  MessageContext context;
  bool direct = false;  // alltoallv (kDirect) instead of allgatherv (kAllgather)
};

// Encodes, exchanges and validates the messages: on return context.buffers.validated holds
// every rank's message (index = rank), context.buffers.message this rank's. Laps the encode,
// collective and validate phases. Throws dgc::CommError, dgc::DecodeError (naming the sender).
AlgorithmResult allgather(const AllgatherOptions& options);

}  // namespace dgc
