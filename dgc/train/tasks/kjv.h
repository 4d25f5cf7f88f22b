// The King James Bible as a word-level language-modelling corpus, from Debian's bible-kjv
// package (the `bible` program). No libtorch here.
//
// Preparation (once, into a cache directory, never the source tree): `bible -f
// 'Gen1:1-Rev22:21'` prints the 31,102 verses, one per line, each after its reference ("Ge1:1 In
// the beginning God created ..."). The reference is dropped and the text tokenized (tokenize
// below); the result is written atomically (temporary file, then rename) as kCorpusFile: a header
// line "dgc-kjv-corpus <version> verses <n> crc32 <hex>" and one line per verse with its words
// separated by single spaces. The crc32 covers every byte after the header line, so a truncated
// or edited file is detected.
//
// Split (fixed, by verse number v = 0 .. 31,101 in canonical order): blocks of 50 consecutive
// verses; block b = v / 50 goes to validation when b % 20 == 18, to test when b % 20 == 19, to
// training otherwise (about 90 / 5 / 5 %). Why: every part of the Bible (law, history, poetry,
// prophets, gospels, letters) is in all three sets, so validation and test measure the same
// language as training rather than a change of genre; blocks keep passages whole, so a model
// that carries its state across verses sees real context, and only block edges border training
// text.
//
// Vocabulary: the most frequent words of the whole training split (ties: alphabetical), after
// id 0 "<unk>" (every other word) and id 1 "<eos>" (the end of every verse).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dgc::train::kjv {

inline constexpr int64_t kVerses = 31102;
inline constexpr int kCorpusVersion = 1;
inline constexpr const char* kCorpusFile = "kjv-corpus-v1.txt";
inline constexpr int64_t kSplitBlock = 50;
inline constexpr int32_t kUnk = 0;
inline constexpr int32_t kEos = 1;

// Words of one verse: ASCII letters are lower-cased; a word is a maximal run of letters, digits
// and apostrophes, with apostrophes at its ends removed ("God's" -> "god's", "fathers'" ->
// "fathers"); every other character (punctuation, hyphens, brackets) separates words and is
// dropped, as in the usual Penn Treebank language-modelling text.
std::vector<std::string> tokenize(std::string_view text);

// $XDG_CACHE_HOME/dgc, else $HOME/.cache/dgc. Throws dgc::InvalidArgument when neither variable
// is set (pass a cache directory explicitly).
std::string default_cache_dir();

// The verses, tokenized, in canonical order (kVerses of them), each one string of words
// separated by single spaces. Reads `cache_dir`/kCorpusFile, preparing it first with `bible`
// (the program, looked up in PATH) when it does not exist. Throws dgc::DataError when `bible`
// cannot be run or prints something unexpected (install bible-kjv), when the cache directory
// cannot be written (pass another one), or when the cache file is corrupt (delete it: it is
// rebuilt on the next run). Safe to call from several processes at once.
std::vector<std::string> load_verses(const std::string& cache_dir,
                                     const std::string& bible = "bible");

// The parsers under load_verses, on bytes (tested and fuzzed on their own):
// The cache file's body (one tokenized verse per line) from what `bible -f 'Gen1:1-Rev22:21'`
// printed; `bible` names the program in messages. Throws dgc::DataError on an unexpected line or
// verse count.
std::string corpus_body(std::string_view bible_output, const std::string& bible);
// The cache file's content for `body`: the header line, then the body.
std::string corpus_file_content(std::string_view body);
// The verses of a cache file's content. Throws dgc::DataError naming `path` when the header,
// checksum, line structure or verse count is wrong.
std::vector<std::string> parse_corpus_file(std::string_view content, const std::string& path);

enum class Part : uint8_t { kTrain, kValidation, kTest };
Part part_of(int64_t verse);
const char* to_string(Part part);

struct Vocabulary {
  std::vector<std::string> words;  // by id
  std::unordered_map<std::string, int32_t> ids;
  int32_t id(const std::string& word) const;  // kUnk when not in the vocabulary
  int64_t size() const { return static_cast<int64_t>(words.size()); }
};

// "<unk>", "<eos>" and the size - 2 most frequent words of the training verses. size >= 3.
Vocabulary build_vocabulary(const std::vector<std::string>& verses, int64_t size);

// The token stream of `part`: the words of its first `limit` verses (all when limit <= 0) as ids,
// each verse followed by kEos. `verse_count`, when given, receives the number of verses used.
std::vector<int32_t> encode(const std::vector<std::string>& verses, const Vocabulary& vocabulary,
                            Part part, int64_t limit = 0, int64_t* verse_count = nullptr);

}  // namespace dgc::train::kjv
