// Job identity and message authentication: the run id every rank of one job shares, and
// HMAC-SHA256 tags (OpenSSL's libcrypto) under keys derived from a job secret.
//
// What it is for: a message or a rendezvous value that does not carry a valid tag under this
// job's key was not made by a rank of this job (or was altered on the way) and must be refused,
// never applied. docs/reliability.md ("Job identity and authentication") has the threat model
// and what stays open.
//
// The secret itself never travels and is never stored past key derivation: derive_job_keys()
// turns it into one key per use (HKDF-SHA256, RFC 5869), so that a tag made for one purpose (an
// exchange message) is never accepted for another (a rendezvous value).
//
// Thread-safety: every function here is safe to call from several threads at once; a
// MessageAuthenticator is immutable after construction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dgc {

inline constexpr size_t kTagBytes = 32;    // HMAC-SHA256
inline constexpr size_t kKeyBytes = 32;    // every derived key
inline constexpr size_t kRunIdBytes = 16;  // 128 bits: two jobs drawing the same id is negligible

using Tag = std::array<uint8_t, kTagBytes>;
using MacKey = std::array<uint8_t, kKeyBytes>;
using RunId = std::array<uint8_t, kRunIdBytes>;

// 128 bits from OpenSSL's CSPRNG (RAND_bytes). Throws dgc::Error if it has no entropy.
RunId random_run_id();

// Lower-case hex, e.g. for logs ("run id 3f2a...").
std::string to_hex(std::span<const uint8_t> bytes);

// HMAC-SHA256 under one key. The parts are authenticated as their concatenation, so callers put
// fixed-size fields first (or length-prefix variable ones) to keep the framing unambiguous.
class MessageAuthenticator {
 public:
  explicit MessageAuthenticator(const MacKey& key) : key_(key) {}

  Tag tag(std::initializer_list<std::span<const uint8_t>> parts) const;
  // True if `tag` is the tag of the parts; compares in constant time (CRYPTO_memcmp). A tag of
  // the wrong size is false.
  bool verify(std::initializer_list<std::span<const uint8_t>> parts,
              std::span<const uint8_t> tag) const;

 private:
  MacKey key_;
};

// The keys of one job, derived from its secret.
struct JobKeys {
  MacKey exchange;    // exchange messages (codec.h) and the exchange handshake
  MacKey rendezvous;  // values in the rendezvous store (Gloo's addresses, dgc's join/ready keys)
};

// HKDF-SHA256 (extract with a fixed salt, then expand with one label per key).
JobKeys derive_job_keys(std::string_view secret);

// The environment variable that holds the job secret, and the least a secret may hold.
inline constexpr const char* kJobSecretEnv = "DGC_JOB_SECRET";
inline constexpr size_t kMinJobSecretBytes = 16;

// The job secret from `file` (a path; empty: none) or from `env_value` (the value of
// DGC_JOB_SECRET; null: unset). One trailing newline of the file is dropped. Returns nullopt
// when neither is given (no authentication). Throws dgc::InvalidArgument when both are given,
// when the file cannot be read, is readable or writable by group or others (chmod 600), or when
// the secret is shorter than kMinJobSecretBytes; the messages say what to do and never contain
// the secret.
std::optional<std::string> load_job_secret(const std::string& file, const char* env_value);

// Overwrites a secret's bytes before its memory is released (OPENSSL_cleanse).
void wipe(std::string& secret);

}  // namespace dgc
