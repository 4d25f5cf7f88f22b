#include "dgc/comm/authenticated_store.h"

#include <array>
#include <cstring>
#include <string_view>

#include "dgc/core/bytes.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

constexpr std::string_view kContext = "dgc-rendezvous";
static_assert(kContext.size() + 4 == 18);

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

AuthenticatedStore::AuthenticatedStore(gloo::rendezvous::Store& inner, const MacKey& key,
                                       std::string description)
    : inner_(inner), auth_(key), description_(std::move(description)) {}

std::array<uint8_t, AuthenticatedStore::kHeadBytes> AuthenticatedStore::head_of(
    const std::string& key) {
  std::array<uint8_t, kHeadBytes> head{};
  std::memcpy(head.data(), kContext.data(), kContext.size());
  const auto length = static_cast<uint32_t>(key.size());
  store_le(head.data() + kContext.size(), length);
  return head;
}

void AuthenticatedStore::set(const std::string& key, const std::vector<char>& data) {
  const std::span<const uint8_t> value(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  const Tag tag = auth_.tag({head_of(key), bytes_of(key), value});
  std::vector<char> tagged(data);
  tagged.insert(tagged.end(), tag.begin(), tag.end());
  inner_.set(key, tagged);
}

std::vector<char> AuthenticatedStore::get(const std::string& key) {
  // A Store's get waits for the key, but Gloo's in-process HashStore returns an empty value for
  // a key not yet set (Gloo reads "rank_<r>" keys that way and tolerates the empty value; an
  // empty value has no tag). Wait first, as every other store does inside get.
  inner_.wait({key});
  std::vector<char> tagged = inner_.get(key);
  const auto refuse = [&](const std::string& why) {
    return AuthenticationError(
        detail::concat("rendezvous through ", description_, ": the value of key '", key, "' ", why,
                       "; refused. Give every rank the same job secret (", kJobSecretEnv,
                       " or --job-secret-file), and keep strangers off the rendezvous port"));
  };
  if (tagged.size() < kTagBytes) {
    throw refuse(detail::concat("(", tagged.size(),
                                " bytes) carries no authentication tag: it was written by a "
                                "process without a job secret"));
  }
  const size_t size = tagged.size() - kTagBytes;
  const auto* bytes = reinterpret_cast<const uint8_t*>(tagged.data());
  if (!auth_.verify({head_of(key), bytes_of(key), {bytes, size}}, {bytes + size, kTagBytes})) {
    throw refuse(
        "does not carry a valid authentication tag: it was written by a process with another "
        "job secret (or none), or altered in the store");
  }
  tagged.resize(size);
  return tagged;
}

}  // namespace dgc::comm
