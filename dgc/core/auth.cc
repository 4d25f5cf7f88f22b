#include "dgc/core/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "dgc/core/error.h"

namespace dgc {
namespace {

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error code";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// The HMAC implementation, fetched once (EVP_MAC_fetch is a property lookup; the result is
// shareable between threads).
EVP_MAC* hmac() {
  static EVP_MAC* const mac = [] {
    EVP_MAC* m = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (m == nullptr) throw Error("OpenSSL has no HMAC: " + openssl_error());
    return m;
  }();
  return mac;
}

struct CtxFree {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};

Tag compute(std::span<const uint8_t> key, std::initializer_list<std::span<const uint8_t>> parts) {
  std::unique_ptr<EVP_MAC_CTX, CtxFree> ctx(EVP_MAC_CTX_new(hmac()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_END};
  if (!ctx || EVP_MAC_init(ctx.get(), key.data(), key.size(), params) != 1) {
    throw Error("HMAC-SHA256 initialisation failed: " + openssl_error());
  }
  for (const auto& part : parts) {
    if (!part.empty() && EVP_MAC_update(ctx.get(), part.data(), part.size()) != 1) {
      throw Error("HMAC-SHA256 update failed: " + openssl_error());
    }
  }
  Tag tag{};
  size_t length = 0;
  if (EVP_MAC_final(ctx.get(), tag.data(), &length, tag.size()) != 1 || length != tag.size()) {
    throw Error("HMAC-SHA256 final failed: " + openssl_error());
  }
  return tag;
}

std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

RunId random_run_id() {
  RunId id{};
  if (RAND_bytes(id.data(), static_cast<int>(id.size())) != 1) {
    throw Error("cannot draw a run id: OpenSSL's random generator failed (" + openssl_error() +
                ")");
  }
  return id;
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

Tag MessageAuthenticator::tag(std::initializer_list<std::span<const uint8_t>> parts) const {
  return compute(key_, parts);
}

bool MessageAuthenticator::verify(std::initializer_list<std::span<const uint8_t>> parts,
                                  std::span<const uint8_t> tag) const {
  if (tag.size() != kTagBytes) return false;
  const Tag expected = compute(key_, parts);
  return CRYPTO_memcmp(expected.data(), tag.data(), kTagBytes) == 0;
}

JobKeys derive_job_keys(std::string_view secret) {
  // RFC 5869 with SHA-256: PRK = HMAC(salt, secret); OKM = HMAC(PRK, info | 0x01) for one
  // 32-byte block.
  static constexpr std::string_view kSalt = "dgc job secret v1";
  const Tag prk = compute(bytes_of(kSalt), {bytes_of(secret)});
  const auto expand = [&prk](std::string_view info) {
    static constexpr uint8_t kCounter[] = {1};
    return compute(prk, {bytes_of(info), kCounter});
  };
  JobKeys keys;
  keys.exchange = expand("dgc exchange messages");
  keys.rendezvous = expand("dgc rendezvous values");
  return keys;
}

void wipe(std::string& secret) {
  if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
  secret.clear();
}

std::optional<std::string> load_job_secret(const std::string& file, const char* env_value) {
  if (!file.empty() && env_value != nullptr) {
    throw InvalidArgument(detail::concat(
        "both --job-secret-file and the environment variable ", kJobSecretEnv,
        " are set; give the secret one way only (unset ", kJobSecretEnv, " or drop the flag)"));
  }
  std::string secret;
  std::string source;
  if (!file.empty()) {
    source = "job secret file '" + file + "'";
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) {
      throw InvalidArgument(
          detail::concat("cannot read the ", source, ": it does not exist or is not accessible"));
    }
    if (!S_ISREG(st.st_mode)) {
      throw InvalidArgument(detail::concat("the ", source, " is not a regular file"));
    }
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      throw InvalidArgument(detail::concat(
          "the ", source, " is accessible to group or others (mode ", std::oct, (st.st_mode & 0777),
          std::dec, "); a secret file must be private: chmod 600 '", file, "'"));
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) throw InvalidArgument(detail::concat("cannot open the ", source));
    secret.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw InvalidArgument(detail::concat("cannot read the ", source));
    if (!secret.empty() && secret.back() == '\n') secret.pop_back();
    if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  } else if (env_value != nullptr) {
    source = detail::concat("environment variable ", kJobSecretEnv);
    secret = env_value;
  } else {
    return std::nullopt;
  }
  if (secret.size() < kMinJobSecretBytes) {
    const size_t size = secret.size();
    wipe(secret);
    throw InvalidArgument(detail::concat("the ", source, " holds ", size,
                                         " bytes; a job secret needs at least ", kMinJobSecretBytes,
                                         " (make one with `openssl rand -hex 32`)"));
  }
  return secret;
}

}  // namespace dgc
