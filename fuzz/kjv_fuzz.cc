// The KJV corpus readers (dgc/train/tasks/kjv.h): the cache file, the output of the `bible`
// program it is prepared from, and the tokenizer.
//
// Input: one byte of options, then text. Option bit 0 set: the text is used as the cache file's
// body behind a correct header (corpus_file_content), so that mutations reach the line parser
// instead of stopping at the checksum; otherwise it is parsed as a whole cache file.
//
// Promises checked: the parsers throw nothing but dgc::DataError; an accepted cache body is
// exactly its verses, each followed by a newline; tokenize gives non-empty lower-case words of
// letters, digits and inner apostrophes, and is idempotent on its own output.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "dgc/core/error.h"
#include "dgc/train/tasks/kjv.h"
#include "fuzz/fuzz_check.h"

namespace kjv = dgc::train::kjv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  // The tokenizer.
  const auto words = kjv::tokenize(text);
  std::string joined;
  for (const auto& w : words) {
    FUZZ_CHECK(!w.empty() && w.front() != '\'' && w.back() != '\'', "word '%s'", w.c_str());
    for (char c : w) {
      FUZZ_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '\'',
                 "character %d in word '%s'", int{c}, w.c_str());
    }
    joined += (joined.empty() ? "" : " ") + w;
  }
  FUZZ_CHECK(kjv::tokenize(joined) == words, "tokenize is not idempotent");

  // The `bible` output parser.
  std::optional<std::string> body;
  if (dgc::fuzz::accepted<dgc::DataError>([&] { body = kjv::corpus_body(text, "bible"); })) {
    FUZZ_CHECK(std::count(body->begin(), body->end(), '\n') == kjv::kVerses, "verse count");
  }

  // The cache file.
  const std::string content = (data[0] & 1) ? kjv::corpus_file_content(text) : std::string(text);
  std::optional<std::vector<std::string>> verses;
  if (dgc::fuzz::accepted<dgc::DataError>(
          [&] { verses = kjv::parse_corpus_file(content, "fuzz-input"); })) {
    FUZZ_CHECK(static_cast<int64_t>(verses->size()) == kjv::kVerses, "%zu verses", verses->size());
    std::string rebuilt;
    for (const auto& v : *verses) rebuilt += v + "\n";
    FUZZ_CHECK(kjv::corpus_file_content(rebuilt) == content, "verses do not rebuild the file");
  }
  return 0;
}
