// The utterances of the speech corpus (speech_corpus.h): the symbols, the drawing of an utterance
// and its speaker, and the text espeak-ng speaks.
#include <iterator>
#include <string>
#include <vector>

#include "dgc/core/error.h"
#include "dgc/train/tasks/speech_corpus.h"
#include "dgc/train/tasks/speech_corpus_internal.h"

namespace dgc::train::speech {
namespace {

constexpr const char* kDigitWords[] = {"zero", "one", "two",   "three", "four",
                                       "five", "six", "seven", "eight", "nine"};

}  // namespace

char symbol_char(int32_t symbol) {
  DGC_CHECK(symbol >= 0 && symbol < kSymbols, "symbol out of range: ", symbol);
  if (symbol == kBlank) return '_';
  if (symbol <= 26) return static_cast<char>('a' + symbol - 1);
  return static_cast<char>('0' + symbol - 27);
}

int32_t symbol_of(char c) {
  if (c >= 'a' && c <= 'z') return 1 + (c - 'a');
  if (c >= '0' && c <= '9') return 27 + (c - '0');
  throw InvalidArgument(detail::concat("no symbol for '", c, "': expected a-z or 0-9"));
}

std::string spoken_word(int32_t symbol) {
  DGC_CHECK(symbol >= 1 && symbol < kSymbols, "symbol out of range: ", symbol);
  if (symbol <= 26) return std::string(1, symbol_char(symbol));
  return kDigitWords[symbol - 27];
}

const char* to_string(Split split) { return split == Split::kTrain ? "train" : "test"; }

Utterance make_utterance(uint64_t seed, Split split, int64_t index) {
  Stream s = utterance_stream(seed, split, index);
  Utterance u;
  u.split = split;
  u.index = index;
  const int64_t length = s.between(3, 8);
  for (int64_t i = 0; i < length; ++i) u.tokens.push_back(static_cast<int32_t>(s.between(1, 36)));
  constexpr auto accents = std::size(kAccents);
  u.accent = kAccents[s.between(0, accents - 1)];
  if (split == Split::kTrain) {
    u.variant = kTrainVariants[s.between(0, std::size(kTrainVariants) - 1)];
  } else {
    u.variant = kTestVariants[s.between(0, std::size(kTestVariants) - 1)];
  }
  u.speed = static_cast<int>(s.between(130, 240));
  u.pitch = static_cast<int>(s.between(25, 75));
  u.amplitude = static_cast<int>(s.between(70, 130));
  u.word_gap = static_cast<int>(s.between(0, 4));
  return u;
}

std::string ssml_text(const std::vector<int32_t>& tokens) {
  std::string text = "<speak>";
  size_t i = 0;
  while (i < tokens.size()) {
    if (i > 0) text += ' ';
    if (tokens[i] <= 26) {
      text += "<say-as interpret-as=\"characters\">";
      while (i < tokens.size() && tokens[i] <= 26) text += symbol_char(tokens[i++]);
      text += "</say-as>";
    } else {
      text += spoken_word(tokens[i++]);
    }
  }
  return text + "</speak>";
}

std::string transcript(const std::vector<int32_t>& tokens) {
  std::string out;
  for (const int32_t t : tokens) out += symbol_char(t);
  return out;
}

}  // namespace dgc::train::speech
