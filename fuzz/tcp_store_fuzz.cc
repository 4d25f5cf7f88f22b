// The TCP store's request handling (dgc/comm/tcp_store_service.h) on the bytes one client sends.
//
// Input: one byte that sets how the bytes arrive (low 4 bits + 1: the number of chunks they are
// cut into, as recv() may return them), then the bytes. Every input first receives a HELLO
// from rank 1 of 4 on another connection, so that the store has a member (the fuzzed client
// may introduce itself as any rank).
//
// Promises checked: handling throws nothing; the replies are complete frames (u32 length |
// status | fields) with a known status; what the service holds stays within its bounds; a
// dropped connection stays dropped and gets no further replies.
#include <algorithm>
#include <vector>

#include "dgc/comm/tcp_store_service.h"
#include "dgc/core/bytes.h"
#include "fuzz/fuzz_check.h"

namespace {

using dgc::comm::TcpStoreService;

std::vector<uint8_t> hello(int32_t rank, int32_t world_size) {
  std::vector<uint8_t> frame;
  dgc::ByteWriter(frame)
      .u32(9)
      .u8(1)
      .u32(static_cast<uint32_t>(rank))
      .u32(static_cast<uint32_t>(world_size));  // length 9, op HELLO
  return frame;
}

// Checks that `out` is a sequence of complete reply frames.
void check_replies(const std::vector<uint8_t>& out) {
  size_t pos = 0;
  while (pos < out.size()) {
    FUZZ_CHECK(out.size() - pos >= 5, "a reply frame is cut at %zu of %zu", pos, out.size());
    const uint32_t n = dgc::load_le<uint32_t>(out.data() + pos);
    FUZZ_CHECK(n >= 1 && out.size() - pos - 4 >= n, "reply length %u at %zu", n, pos);
    FUZZ_CHECK(out[pos + 4] <= 3, "unknown status %d", int{out[pos + 4]});
    pos += 4 + n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t chunks = (data[0] & 15) + 1;
  const uint8_t* bytes = data + 1;
  const size_t length = size - 1;

  TcpStoreService service("127.0.0.1:29500", 4);
  TcpStoreService::Connection member;
  member.in = hello(1, 4);
  FUZZ_CHECK(service.process_frames(member) && member.rank == 1, "rank 1's HELLO refused");

  TcpStoreService::Connection client;
  const size_t step = std::max<size_t>(1, (length + chunks - 1) / chunks);
  for (size_t begin = 0; begin < length; begin += step) {
    const size_t end = std::min(length, begin + step);
    client.in.insert(client.in.end(), bytes + begin, bytes + end);
    const size_t replies_before = client.out.size();
    const bool alive = service.process_frames(client);
    FUZZ_CHECK(alive == !client.dead, "process_frames returned %d for a %s connection", alive,
               client.dead ? "dropped" : "live");
    if (!alive) break;
    FUZZ_CHECK(client.in.size() <= TcpStoreService::kMaxFrameBytes + 4, "%zu unhandled bytes kept",
               client.in.size());
    FUZZ_CHECK(client.out.size() >= replies_before, "replies lost");
  }
  check_replies(client.out);
  FUZZ_CHECK(service.stored_bytes() <= TcpStoreService::kMaxStoredBytes, "%zu bytes stored",
             service.stored_bytes());
  FUZZ_CHECK(service.key_count() <= TcpStoreService::kMaxKeys, "%zu keys", service.key_count());
  return 0;
}
