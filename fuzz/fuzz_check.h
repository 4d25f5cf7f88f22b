// Checks for fuzz targets: a broken promise prints what was expected and aborts, which libFuzzer
// and the replay runner both report as a failure with the input that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <utility>

#define FUZZ_CHECK(condition, ...)                                                              \
  do {                                                                                          \
    if (!(condition)) {                                                                         \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #condition); \
      std::fprintf(stderr, __VA_ARGS__);                                                        \
      std::fprintf(stderr, "\n");                                                               \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

namespace dgc::fuzz {

// Runs fn(); an exception of type Allowed is the parser's documented rejection and returns false.
// Any other exception escapes (an uncaught exception is a failure of the target).
template <typename Allowed, typename Fn>
bool accepted(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const Allowed& e) {
    FUZZ_CHECK(std::string(e.what()).size() > 0, "a rejection must say why");
    return false;
  }
}

// Splits an input at its first byte of value `separator` (the separator belongs to neither part).
inline std::pair<std::span<const uint8_t>, std::span<const uint8_t>> split_at(
    std::span<const uint8_t> input, uint8_t separator) {
  for (size_t i = 0; i < input.size(); ++i) {
    if (input[i] == separator) return {input.first(i), input.subspan(i + 1)};
  }
  return {input, {}};
}

}  // namespace dgc::fuzz
