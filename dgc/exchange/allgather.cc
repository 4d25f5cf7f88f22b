#include "dgc/exchange/allgather.h"

#include <vector>

namespace dgc {

AlgorithmResult allgather(const AllgatherOptions& options) {
  const MessageContext& context = options.context;
  auto& buffers = context.buffers;
  MessageEncoder encoder(context);
  encoder.begin(context.flags);
  for (size_t i = 0; i < context.layout.compressed.size(); ++i) {
    encoder.add(i, context.selections[i].indices, context.selections[i].values);
  }
  encoder.finish(buffers.message, kEveryRank);
  context.clock.lap(Phase::kEncode);

  buffers.release_received();
  if (options.direct) {
    const std::vector<std::span<const uint8_t>> to_each(static_cast<size_t>(context.comm.size()),
                                                        buffers.message);
    buffers.received = context.comm.alltoallv(to_each, context.timeout);
  } else {
    buffers.received = context.comm.allgatherv(buffers.message, context.timeout);
  }
  context.clock.lap(Phase::kCollective);
  const int flagged = validate_messages(context, "message", kEveryRank);
  context.clock.lap(Phase::kValidate);
  return {flagged, encoder.bytes()};
}

}  // namespace dgc
