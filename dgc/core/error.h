// Error types shared by every layer of dgc, and check macros that print both compared values.
//
// Contract: library code never aborts on an error a caller could handle; it throws one of these.
// Messages say what was expected, what was found and, where it helps, what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dgc {

// Root of the family. Catch this to catch every dgc failure.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value outside the documented contract (bad option, wrong size, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A wire message failed validation. Nothing was written to any output buffer.
//   kForeignRun:     the message names another job (run id) than the receiver's;
//   kWrongIteration: it is for another iteration than the receiver's;
//   kBadTag:         its authentication tag is missing, wrong, or present where the receiver
//                    has no job secret (see dgc/core/auth.h).
class DecodeError : public Error {
 public:
  enum class Reason {
    kTruncated,
    kBadMagic,
    kBadVersion,
    kBadChecksum,
    kOutOfRange,
    kMalformed,
    kForeignRun,
    kWrongIteration,
    kBadTag
  };
  DecodeError(Reason reason, const std::string& what) : Error(what), reason_(reason) {}
  Reason reason() const noexcept { return reason_; }

 private:
  Reason reason_;
};

// The communication layer failed: a peer died, a connection broke, a collective failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete within its timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// Ranks disagree on something they must agree on (tensor layout, settings, world size).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// A rendezvous value or handshake message failed authentication under the job secret: it was
// not written by a rank of this job, or the ranks were given different secrets.
class AuthenticationError : public Error {
 public:
  using Error::Error;
};

// Input data is missing or malformed (data set path, checkpoint file, ...).
class DataError : public Error {
 public:
  using Error::Error;
};

// Non-finite numbers where finite ones are required (NaN/Inf gradients).
class NumericError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace dgc

// DGC_CHECK(cond, message parts...): throws dgc::InvalidArgument naming the failed condition.
#define DGC_CHECK(cond, ...)                                                \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ::dgc::InvalidArgument(                                         \
          ::dgc::detail::concat("check failed: " #cond ": ", __VA_ARGS__)); \
    }                                                                       \
  } while (0)

// DGC_CHECK_OP(a, op, b, message parts...): throws dgc::InvalidArgument printing both values.
#define DGC_CHECK_OP(a, op, b, ...)                                                               \
  do {                                                                                            \
    const auto& dgc_check_a_ = (a);                                                               \
    const auto& dgc_check_b_ = (b);                                                               \
    if (!(dgc_check_a_ op dgc_check_b_)) {                                                        \
      throw ::dgc::InvalidArgument(::dgc::detail::concat("check failed: " #a " " #op " " #b " (", \
                                                         dgc_check_a_, " vs ", dgc_check_b_,      \
                                                         "): ", __VA_ARGS__));                    \
    }                                                                                             \
  } while (0)

#define DGC_CHECK_EQ(a, b, ...) DGC_CHECK_OP(a, ==, b, __VA_ARGS__)
#define DGC_CHECK_LE(a, b, ...) DGC_CHECK_OP(a, <=, b, __VA_ARGS__)
#define DGC_CHECK_LT(a, b, ...) DGC_CHECK_OP(a, <, b, __VA_ARGS__)
#define DGC_CHECK_GE(a, b, ...) DGC_CHECK_OP(a, >=, b, __VA_ARGS__)
#define DGC_CHECK_GT(a, b, ...) DGC_CHECK_OP(a, >, b, __VA_ARGS__)
