// One table of names per enum: the one place a value's name is written. Parsing, printing, the
// settings lines, the command line's choices (CLI11 IsMember) and the Python binding's keyword
// arguments all read the same table, so that a name cannot differ between them.
//
// Each enum's table sits beside the enum (kValueTypeNames in options.h, kClipScalingNames in
// clip.h, kExchangeAlgorithmNames in exchange/algorithm.h, ...), in the order the command line
// lists the choices. Pure; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dgc/core/error.h"

namespace dgc {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E, size_t N>
using EnumNames = std::array<EnumName<E>, N>;

// The name of `value`; "unknown" for a value the table does not hold.
template <typename E, size_t N>
const char* name_of(const EnumNames<E, N>& names, E value) {
  for (const auto& entry : names) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

// Every name, in the table's order (for CLI11's IsMember).
template <typename E, size_t N>
std::vector<std::string> names_of(const EnumNames<E, N>& names) {
  std::vector<std::string> out;
  for (const auto& entry : names) out.emplace_back(entry.name);
  return out;
}

// "a, b or c".
template <typename E, size_t N>
std::string name_choices(const EnumNames<E, N>& names) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += names[i].name;
  }
  return out;
}

// The value called `name`; anything else throws dgc::InvalidArgument "unknown <what> '<name>':
// expected a, b or c".
template <typename E, size_t N>
E parse_name(const EnumNames<E, N>& names, std::string_view name, const char* what) {
  for (const auto& entry : names) {
    if (name == entry.name) return entry.value;
  }
  throw InvalidArgument(
      detail::concat("unknown ", what, " '", name, "': expected ", name_choices(names)));
}

}  // namespace dgc
