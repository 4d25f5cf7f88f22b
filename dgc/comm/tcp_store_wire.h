// The TCP store's wire protocol, shared by its client (tcp_store.cc) and its request handling
// (tcp_store_service.cc). Little endian, written and read with ByteWriter/ByteReader:
//   frame   = u32 body_length | body
//   request = u8 op | fields;      reply = u8 status | fields
//   string  = u32 length | bytes
//   HELLO rank i32, world_size i32 -> kOk | kError | kMismatch
//   SET   key, value               -> kOk
//   GET   key                      -> kOk value | kMissing
//   CHECK u32 n, n keys            -> kOk u8 all_present
//   BYE                            -> kOk (the server counts it; the client then disconnects)
// The bounds on each field are TcpStoreService's constants (tcp_store_service.h).
#pragma once

#include <cstdint>

namespace dgc::comm::tcp_store_wire {

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kCheck = 4, kBye = 5 };
enum Status : uint8_t { kOk = 0, kMissing = 1, kError = 2, kMismatch = 3 };

}  // namespace dgc::comm::tcp_store_wire
