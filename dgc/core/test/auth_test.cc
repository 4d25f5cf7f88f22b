// Job identity and authentication primitives (auth.h): HMAC-SHA256 against values computed
// with Python's hmac module, key derivation, and loading the job secret.
#include "dgc/core/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "dgc/core/error.h"

namespace dgc {
namespace {

std::span<const uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Auth, HmacSha256MatchesAnIndependentImplementation) {
  // python3 -c "import hmac,hashlib; print(hmac.new(b'\x0b'*32, b'Hi There',
  //             hashlib.sha256).hexdigest())"
  MacKey key{};
  key.fill(0x0b);
  const MessageAuthenticator auth(key);
  EXPECT_EQ(to_hex(auth.tag({bytes("Hi There")})),
            "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7");
  // Parts are authenticated as their concatenation.
  EXPECT_EQ(auth.tag({bytes("Hi "), bytes(""), bytes("There")}), auth.tag({bytes("Hi There")}));
}

TEST(Auth, VerifyAcceptsOnlyTheExactTag) {
  MacKey key{};
  key.fill(1);
  const MessageAuthenticator auth(key);
  const Tag tag = auth.tag({bytes("message")});
  EXPECT_TRUE(auth.verify({bytes("message")}, tag));
  EXPECT_FALSE(auth.verify({bytes("messagE")}, tag));
  for (size_t i = 0; i < tag.size(); ++i) {
    Tag bad = tag;
    bad[i] ^= 0x80;
    EXPECT_FALSE(auth.verify({bytes("message")}, bad)) << i;
  }
  EXPECT_FALSE(auth.verify({bytes("message")}, std::span<const uint8_t>(tag).first(31)));
  MacKey other = key;
  other[0] ^= 1;
  EXPECT_FALSE(MessageAuthenticator(other).verify({bytes("message")}, tag));
}

TEST(Auth, KeysAreDerivedWithHkdfSha256OnePerUse) {
  // HKDF-SHA256 (RFC 5869) computed in Python: PRK = HMAC(b"dgc job secret v1", secret),
  // key = HMAC(PRK, label + b"\x01").
  const JobKeys keys = derive_job_keys("correct horse battery staple");
  EXPECT_EQ(to_hex(keys.exchange),
            "7b7e3eeab8ce5af12ad03352077dee71cbde239f067521837b3a8ff03c485a07");
  EXPECT_EQ(to_hex(keys.rendezvous),
            "fcd41769e2b9f4a920cd5039cfcc2c559030b6cbaaf852064eb1db83ae4f1c3d");
  EXPECT_NE(derive_job_keys("correct horse battery staplE").exchange, keys.exchange);
}

TEST(Auth, RunIdsAreRandom) {
  std::set<RunId> seen;
  for (int i = 0; i < 100; ++i) seen.insert(random_run_id());
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(to_hex(RunId{}).size(), 32u);
}

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("dgc_auth_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content, mode_t mode) {
    const auto path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::filesystem::path dir_;
};

std::string error_of(const std::string& file, const char* env) {
  try {
    load_job_secret(file, env);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST_F(SecretFile, NoSecretMeansNoAuthentication) {
  EXPECT_EQ(load_job_secret("", nullptr), std::nullopt);
}

TEST_F(SecretFile, ReadsAPrivateFileWithoutItsTrailingNewline) {
  const auto path = write("secret", "0123456789abcdef0123\n", 0600);
  EXPECT_EQ(load_job_secret(path, nullptr), "0123456789abcdef0123");
  EXPECT_EQ(load_job_secret("", "an environment secret"), "an environment secret");
}

TEST_F(SecretFile, RefusesAFileOthersCanRead) {
  const auto path = write("secret", "0123456789abcdef0123\n", 0644);
  const std::string what = error_of(path, nullptr);
  EXPECT_NE(what.find("chmod 600"), std::string::npos) << what;
  EXPECT_EQ(what.find("0123456789abcdef"), std::string::npos) << "the secret leaked: " << what;
}

TEST_F(SecretFile, RefusesAShortSecretWithoutPrintingIt) {
  const auto path = write("secret", "short secret", 0600);
  std::string what = error_of(path, nullptr);
  EXPECT_NE(what.find("openssl rand -hex 32"), std::string::npos) << what;
  EXPECT_EQ(what.find("short secret"), std::string::npos) << "the secret leaked: " << what;
  what = error_of("", "tiny");
  EXPECT_NE(what.find(kJobSecretEnv), std::string::npos) << what;
  EXPECT_EQ(what.find("tiny"), std::string::npos) << what;
}

TEST_F(SecretFile, RefusesBothWaysAtOnceAndAMissingFile) {
  const auto path = write("secret", "0123456789abcdef0123", 0600);
  EXPECT_NE(error_of(path, "0123456789abcdef0123").find("one way only"), std::string::npos);
  EXPECT_NE(error_of((dir_ / "missing").string(), nullptr).find("does not exist"),
            std::string::npos);
}

}  // namespace
}  // namespace dgc
