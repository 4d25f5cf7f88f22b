// A gloo::rendezvous::Store decorator that tags every value it writes and verifies every value it
// reads, under the job's rendezvous key (JobKeys::rendezvous, dgc/core/auth.h).
//
// set(key, value) stores value | HMAC-SHA256("dgc-rendezvous" | u32 key length | key | value);
// get(key) waits for the key (as Store::get promises; Gloo's HashStore does not), then returns
// the value only if its tag verifies, and otherwise throws
// dgc::AuthenticationError naming the key: a value written by a process without the job secret
// (a stranger, or a rank given another secret), altered in the store, or moved from another key
// is refused. This protects what the rendezvous carries: Gloo's pair addresses (a forged one
// would point a rank's data connection at a stranger) and dgc's join/ready/done keys.
//
// Not covered: the inner store's atomic counters (c10d's add, used for the "claim" check) hold
// integers and cannot carry a tag; a stranger can at worst make a rank believe it was started
// twice, which stops the job. Values are not encrypted (addresses and host names are not
// secret). A value replayed from an earlier job under the same secret and the same key is
// accepted here; the exchange still refuses that job's messages by their run id.
//
// Thread-safety: as the inner store's; the key is immutable. The inner store must outlive this.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "dgc/core/auth.h"

namespace dgc::comm {

class AuthenticatedStore final : public gloo::rendezvous::Store {
 public:
  // `description` names the inner store in errors ("the store rank 0 serves at A:P").
  AuthenticatedStore(gloo::rendezvous::Store& inner, const MacKey& key, std::string description);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  static constexpr size_t kHeadBytes = 14 + 4;  // "dgc-rendezvous" | u32 key length
  static std::array<uint8_t, kHeadBytes> head_of(const std::string& key);

  gloo::rendezvous::Store& inner_;
  MessageAuthenticator auth_;
  std::string description_;
};

}  // namespace dgc::comm
