// The one "key=value" lines parser (settings and rendezvous records).
#include "dgc/core/key_value.h"

#include <gtest/gtest.h>

namespace dgc {
namespace {

using Map = std::map<std::string, std::string>;

TEST(KeyValueLines, SplitsAtTheFirstEqualsSign) {
  EXPECT_EQ(parse_key_value_lines("density=0.001\nurl=a=b\n"),
            (Map{{"density", "0.001"}, {"url", "a=b"}}));
}

TEST(KeyValueLines, IgnoresEmptyLinesAndCarriageReturnsAndKeepsTheLastValue) {
  EXPECT_EQ(parse_key_value_lines("\n\na=1\r\n\r\nb=2\na=3"), (Map{{"a", "3"}, {"b", "2"}}));
  EXPECT_EQ(parse_key_value_lines(""), Map{});
}

TEST(KeyValueLines, ALineWithoutEqualsSignIsAKeyWithAnEmptyValue) {
  EXPECT_EQ(parse_key_value_lines("nesterov\n=x\nk=\n"),
            (Map{{"nesterov", ""}, {"", "x"}, {"k", ""}}));
}

TEST(KeyValueLines, KeepsBytesThatAreNotText) {
  const std::string text("a=\0\xff\nb\0=1", 9);
  EXPECT_EQ(parse_key_value_lines(text),
            (Map{{"a", std::string("\0\xff", 2)}, {std::string("b\0", 2), "1"}}));
}

}  // namespace
}  // namespace dgc
