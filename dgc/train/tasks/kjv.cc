#include "dgc/train/tasks/kjv.h"

#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "dgc/core/crc32.h"
#include "dgc/core/error.h"

namespace dgc::train::kjv {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInstall =
    "install the Debian package bible-kjv (scripts/setup.sh does: apt-get install bible-kjv)";

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '\'';
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `bible` and returns the body of the cache file (one tokenized verse per line).
std::string prepare_body(const std::string& bible) {
  const std::string command = shell_quote(bible) + " -f 'Gen1:1-Rev22:21' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    throw DataError("cannot run '" + bible + "' to prepare the KJV corpus: " + kInstall);
  }
  std::string output;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    const std::string first_line = output.substr(0, output.find('\n'));
    throw DataError(detail::concat("'", bible, "' failed (exit status ",
                                   WIFEXITED(status) ? WEXITSTATUS(status) : status,
                                   (first_line.empty() ? "" : ": " + first_line),
                                   "); the KJV corpus comes from it: ", kInstall));
  }
  return corpus_body(output, bible);
}

std::string header_for(std::string_view body) {
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32_of(body));
  return detail::concat("dgc-kjv-corpus ", kCorpusVersion, " verses ", kVerses, " crc32 ", crc);
}

void write_cache(const fs::path& path, const std::string& content) {
  const fs::path temp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(temp, ignored);
      throw DataError("cannot write the KJV corpus cache " + temp.string() +
                      ": pass a writable cache directory (--cache-dir)");
    }
  }
  std::error_code error;
  fs::rename(temp, path, error);
  if (error) {
    fs::remove(temp, error);
    throw DataError("cannot move the KJV corpus cache into place at " + path.string() +
                    ": pass a writable cache directory (--cache-dir)");
  }
}

}  // namespace

std::string corpus_body(std::string_view bible_output, const std::string& bible) {
  std::istringstream in{std::string(bible_output)};
  std::string line;
  std::string body;
  int64_t verses = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    // "Ge1:1 In the beginning ...": a reference (book, chapter:verse), a space, the text.
    const size_t space = line.find(' ');
    const size_t colon = line.find(':');
    if (space == std::string::npos || colon == std::string::npos || colon > space) {
      throw DataError(detail::concat("unexpected line ", verses + 1, " from '", bible, "': '",
                                     line.substr(0, 80),
                                     "' (expected 'Ge1:1 In the beginning"
                                     " ...'); ",
                                     kInstall));
    }
    const auto words = tokenize(std::string_view(line).substr(space + 1));
    std::string joined;
    for (const auto& w : words) joined += (joined.empty() ? "" : " ") + w;
    body += joined;
    body += '\n';
    ++verses;
  }
  if (verses != kVerses) {
    throw DataError(detail::concat("'", bible, "' printed ", verses, " verses, expected ", kVerses,
                                   " (Genesis 1:1 to Revelation 22:21); ", kInstall));
  }
  return body;
}

std::string corpus_file_content(std::string_view body) {
  return header_for(body) + "\n" + std::string(body);
}

std::vector<std::string> parse_corpus_file(std::string_view content, const std::string& path) {
  const auto corrupt = [&](const std::string& what) {
    return DataError("the KJV corpus cache " + path + " is corrupt (" + what +
                     "): delete it and it is prepared again on the next run");
  };
  const size_t end_of_header = content.find('\n');
  if (end_of_header == std::string_view::npos) throw corrupt("no header line");
  const std::string header(content.substr(0, end_of_header));
  const std::string_view body = content.substr(end_of_header + 1);
  if (header.rfind("dgc-kjv-corpus ", 0) != 0) throw corrupt("no 'dgc-kjv-corpus' header");
  if (header != header_for(body)) {
    throw corrupt("header '" + header + "' does not match the content, expected '" +
                  header_for(body) + "'");
  }
  std::vector<std::string> verses;
  verses.reserve(static_cast<size_t>(std::count(body.begin(), body.end(), '\n')));
  size_t begin = 0;
  while (begin < body.size()) {
    const size_t end = body.find('\n', begin);
    if (end == std::string_view::npos) throw corrupt("the last line is not terminated");
    verses.emplace_back(body.substr(begin, end - begin));
    begin = end + 1;
  }
  if (static_cast<int64_t>(verses.size()) != kVerses) {
    throw corrupt(detail::concat(verses.size(), " verses, expected ", kVerses));
  }
  return verses;
}

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && !is_word_char(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && is_word_char(text[j])) ++j;
    size_t b = i;
    size_t e = j;
    while (b < e && text[b] == '\'') ++b;
    while (e > b && text[e - 1] == '\'') --e;
    if (e > b) {
      std::string word(text.substr(b, e - b));
      for (char& c : word) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      }
      words.push_back(std::move(word));
    }
    i = j;
  }
  return words;
}

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] != '\0') return (fs::path(xdg) / "dgc").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return (fs::path(home) / ".cache" / "dgc").string();
  throw InvalidArgument(
      "neither XDG_CACHE_HOME nor HOME is set: pass a cache directory for the KJV corpus "
      "(--cache-dir DIR)");
}

std::vector<std::string> load_verses(const std::string& cache_dir, const std::string& bible) {
  const fs::path path = fs::path(cache_dir) / kCorpusFile;
  std::error_code error;
  if (!fs::exists(path, error)) {
    fs::create_directories(cache_dir, error);
    if (error) {
      throw DataError("cannot create the cache directory " + cache_dir + " (" + error.message() +
                      "): pass a writable one (--cache-dir DIR)");
    }
    write_cache(path, corpus_file_content(prepare_body(bible)));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError("cannot read the KJV corpus cache " + path.string() +
                    ": delete it (it is prepared again) or pass another --cache-dir");
  }
  std::ostringstream content;
  content << in.rdbuf();
  return parse_corpus_file(content.str(), path.string());
}

Part part_of(int64_t verse) {
  const int64_t block = verse / kSplitBlock;
  if (block % 20 == 18) return Part::kValidation;
  if (block % 20 == 19) return Part::kTest;
  return Part::kTrain;
}

const char* to_string(Part part) {
  switch (part) {
    case Part::kTrain:
      return "train";
    case Part::kValidation:
      return "validation";
    case Part::kTest:
      break;
  }
  return "test";
}

int32_t Vocabulary::id(const std::string& word) const {
  const auto it = ids.find(word);
  return it == ids.end() ? kUnk : it->second;
}

Vocabulary build_vocabulary(const std::vector<std::string>& verses, int64_t size) {
  DGC_CHECK_GE(size, 3, "vocabulary size (<unk>, <eos> and at least one word)");
  std::unordered_map<std::string, int64_t> counts;
  for (size_t v = 0; v < verses.size(); ++v) {
    if (part_of(static_cast<int64_t>(v)) != Part::kTrain) continue;
    std::istringstream in(verses[v]);
    std::string word;
    while (in >> word) ++counts[word];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  Vocabulary vocabulary;
  vocabulary.words = {"<unk>", "<eos>"};
  for (const auto& [word, count] : sorted) {
    if (vocabulary.size() >= size) break;
    vocabulary.words.push_back(word);
  }
  for (size_t i = 0; i < vocabulary.words.size(); ++i) {
    vocabulary.ids.emplace(vocabulary.words[i], static_cast<int32_t>(i));
  }
  return vocabulary;
}

std::vector<int32_t> encode(const std::vector<std::string>& verses, const Vocabulary& vocabulary,
                            Part part, int64_t limit, int64_t* verse_count) {
  std::vector<int32_t> stream;
  int64_t used = 0;
  for (size_t v = 0; v < verses.size(); ++v) {
    if (limit > 0 && used >= limit) break;
    if (part_of(static_cast<int64_t>(v)) != part) continue;
    std::istringstream in(verses[v]);
    std::string word;
    while (in >> word) stream.push_back(vocabulary.id(word));
    stream.push_back(kEos);
    ++used;
  }
  if (verse_count != nullptr) *verse_count = used;
  return stream;
}

}  // namespace dgc::train::kjv
