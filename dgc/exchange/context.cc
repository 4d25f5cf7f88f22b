#include "dgc/exchange/context.h"

#include "dgc/core/error.h"

namespace dgc {

void PhaseClock::lap(Phase phase) {
  const auto now = Clock::now();
  seconds_[static_cast<size_t>(phase)] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

MessageEncoder::MessageEncoder(const MessageContext& context)
    : context_(context), writer_(context.value_type, context.iteration, context.job.run_id) {}

void MessageEncoder::begin(uint16_t flags) {
  writer_.reset(context_.value_type, context_.iteration);
  writer_.set_flags(flags);
}

void MessageEncoder::add(size_t i, std::span<const uint32_t> indices,
                         std::span<const float> values) {
  const size_t before = writer_.payload_bytes();
  writer_.add(static_cast<uint32_t>(i), context_.layout.compressed_numels[i], indices, values);
  (context_.layout.dense_path_group == i ? bytes_.dense_path : bytes_.compressed) +=
      writer_.payload_bytes() - before;
}

void MessageEncoder::finish(std::vector<uint8_t>& out, uint32_t receiver) {
  bytes_.headers += kMessageHeaderBytes;
  if (const MessageAuthenticator* auth = context_.job.auth()) {
    writer_.finish(out, *auth, {static_cast<uint32_t>(context_.comm.rank()), receiver});
    bytes_.headers += kTagBytes;
  } else {
    writer_.finish(out);
  }
  bytes_.total += out.size();
}

int validate_messages(const MessageContext& context, const char* what, uint32_t receiver) {
  const int n = context.comm.size();
  auto& validated = context.buffers.validated;
  validated.clear();
  validated.reserve(static_cast<size_t>(n));
  int flagged = 0;
  MessageExpectation expect;
  expect.run_id = context.job.run_id;
  expect.iteration = context.iteration;
  expect.authenticator = context.job.auth();
  expect.route.receiver = receiver;
  for (int r = 0; r < n; ++r) {
    expect.route.sender = static_cast<uint32_t>(r);
    try {
      validated.push_back(ValidatedMessage::validate(context.buffers.received[r],
                                                     context.layout.compressed_numels, &expect));
    } catch (const DecodeError& e) {
      throw DecodeError(e.reason(),
                        detail::concat(what, " from rank ", r, " of ", n, " (iteration ",
                                       context.iteration, "): ", e.what()));
    }
    if (validated.back().info().flags & kFlagBadGradient) ++flagged;
  }
  return flagged;
}

}  // namespace dgc
