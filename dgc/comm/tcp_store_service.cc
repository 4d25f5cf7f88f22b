// The TCP store's request handling on bytes (tcp_store_service.h); the wire format is in
// tcp_store_wire.h.
#include "dgc/comm/tcp_store_service.h"

#include <algorithm>
#include <chrono>

#include "dgc/comm/tcp_store_wire.h"
#include "dgc/core/error.h"

namespace dgc::comm {

using namespace tcp_store_wire;

TcpStoreService::TcpStoreService(std::string where, int world_size)
    : where_(std::move(where)), world_size_(world_size) {}

void TcpStoreService::linger_after_refusal(Timeout timeout) {
  std::unique_lock lock(mutex_);
  if (!refused_) return;
  byes_cv_.wait_for(lock, timeout, [&] {
    return static_cast<int>(told_.size() - told_.count(0)) >= world_size_ - 1;
  });
}

bool TcpStoreService::wait_for_byes(int count, Timeout timeout) {
  std::unique_lock lock(mutex_);
  return byes_cv_.wait_for(lock, timeout, [&] { return byes_ >= count || refused_; });
}

bool TcpStoreService::process_frames(Connection& c) {
  size_t pos = 0;
  while (c.in.size() - pos >= 4) {
    const uint32_t n = load_le<uint32_t>(c.in.data() + pos);
    if (n > kMaxFrameBytes || n == 0) {
      c.dead = true;  // not our protocol, or over the bounds
      return false;
    }
    if (c.in.size() - pos - 4 < n) break;
    handle(c, c.in.data() + pos + 4, n);
    pos += 4 + n;
    if (c.dead) return false;
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  return true;
}

void TcpStoreService::reply(Connection& c, uint8_t status, const std::vector<uint8_t>& fields) {
  ByteWriter(c.out).u32(static_cast<uint32_t>(1 + fields.size())).u8(status).raw(fields);
}

void TcpStoreService::refuse(Connection& c, int rank) {
  std::vector<uint8_t> f;
  ByteWriter(f).string(error_);
  reply(c, kMismatch, f);
  std::lock_guard lock(mutex_);
  told_.insert(rank);
  byes_cv_.notify_all();
}

void TcpStoreService::fail_all(const std::string& message) {
  if (error_.empty()) error_ = message;
  std::lock_guard lock(mutex_);
  refused_ = true;
  byes_cv_.notify_all();
}

void TcpStoreService::handle(Connection& c, const uint8_t* body, size_t size) {
  try {
    ByteReader request({body, size}, "store request");
    handle_request(c, request);
  } catch (const DecodeError&) {
    c.dead = true;  // a truncated or oversized field: not our protocol
  }
}

void TcpStoreService::handle_request(Connection& c, ByteReader& r) {
  const uint8_t op = r.u8("operation");
  if (op == kBye) {
    reply(c, kOk);
    c.close_after_write = true;
    if (c.rank != 0) {
      std::lock_guard lock(mutex_);
      ++byes_;
      byes_cv_.notify_all();
    }
    return;
  }
  if (op == kHello) {
    const auto rank = static_cast<int32_t>(r.u32("rank"));
    const auto world_size = static_cast<int32_t>(r.u32("world size"));
    if (world_size != world_size_) {
      fail_all(detail::concat(
          "world size mismatch: rank ", rank, " was started with WORLD_SIZE=", world_size,
          " but rank 0 (the master at ", where_, ") has WORLD_SIZE=", world_size_,
          "; start every process with the same WORLD_SIZE"));
    } else if (rank < 0 || rank >= world_size_) {
      fail_all(detail::concat("a process connected with RANK=", rank, ", outside [0, ", world_size_,
                              ") for WORLD_SIZE=", world_size_));
    } else if (seen_ranks_.count(rank) != 0) {  // every accepted HELLO is in seen_ranks_
      fail_all(detail::concat("two processes were started with RANK=", rank,
                              "; every process needs its own RANK in [0, ", world_size_, ")"));
    } else {
      c.rank = rank;
      seen_ranks_.insert(rank);
    }
    if (!error_.empty()) {
      refuse(c, rank);
      return;
    }
    reply(c, kOk);
    return;
  }
  if (c.rank < 0) {
    c.dead = true;  // every client introduces itself first
    return;
  }
  if (!error_.empty()) {
    refuse(c, c.rank);
    return;
  }
  switch (op) {
    case kSet: {
      std::string key = r.string(kMaxKeyBytes, "key");
      std::string value = r.string(kMaxValueBytes, "value");
      auto it = data_.find(key);
      const size_t old = it == data_.end() ? 0 : it->first.size() + it->second.size();
      if ((it == data_.end() && data_.size() >= kMaxKeys) ||
          stored_bytes_ - old + key.size() + value.size() > kMaxStoredBytes) {
        std::vector<uint8_t> f;
        ByteWriter(f).string("rendezvous store is full (bounded at 65536 keys, 256 MiB)");
        reply(c, kError, f);
        return;
      }
      stored_bytes_ = stored_bytes_ - old + key.size() + value.size();
      data_[std::move(key)] = std::move(value);
      reply(c, kOk);
      return;
    }
    case kGet: {
      const std::string key = r.string(kMaxKeyBytes, "key");
      auto it = data_.find(key);
      if (it == data_.end()) {
        reply(c, kMissing);
        return;
      }
      std::vector<uint8_t> f;
      ByteWriter(f).string(it->second);
      reply(c, kOk, f);
      return;
    }
    case kCheck: {
      const uint32_t n = r.u32("key count");
      if (n > kMaxCheckKeys) {
        c.dead = true;
        return;
      }
      bool all = true;
      for (uint32_t i = 0; i < n; ++i) {
        const std::string key = r.string(kMaxKeyBytes, "key");
        all = all && data_.count(key) != 0;
      }
      reply(c, kOk, {static_cast<uint8_t>(all ? 1 : 0)});
      return;
    }
    default:
      c.dead = true;
  }
}

}  // namespace dgc::comm
