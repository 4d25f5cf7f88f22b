// What every rank checks once, before the first exchange: the start-up handshake (the same world
// size, layout and settings on every rank; the job's run id; with a job secret, that every rank
// has the same one), and the initial broadcast of the parameters. Both are collective: every
// rank calls them, in the same order. Exchange's constructor runs the handshake.
#pragma once

#include <span>
#include <string>

#include "dgc/comm/communicator.h"
#include "dgc/core/auth.h"
#include "dgc/exchange/layout.h"

namespace dgc {

// Start-up handshake: every rank checks that all ranks have the same world size, the same layout
// (names, shapes, paths, order) and the same settings. On any difference every rank throws
// dgc::MismatchError naming the first difference and the ranks involved. Returns the job's run
// id: rank 0's random_run_id(), the same on every rank.
// With `auth` every rank's description carries a tag under it, bound to the sender's rank; a
// rank whose tag does not verify (another secret) makes every rank throw
// dgc::AuthenticationError, and ranks of which some have a key and some not throw
// dgc::MismatchError, both naming the ranks.
RunId handshake(comm::Communicator& comm, std::span<const TensorSpec> layout,
                const std::string& settings, comm::Timeout timeout = comm::kUnsetTimeout,
                const MessageAuthenticator* auth = nullptr);

// Overwrites every rank's `parameters` with rank 0's.
void broadcast_parameters(comm::Communicator& comm, std::span<const std::span<float>> parameters,
                          comm::Timeout timeout = comm::kUnsetTimeout);

}  // namespace dgc
