// What the speech corpus's files (speech_corpus.cc, speech_utterances.cc, speech_audio.cc)
// share: its random streams (speech_corpus.h, "Determinism": splitmix64, whose output is the same
// on every platform, and the stream of one utterance, a function of (seed, split, index) alone)
// and the remedy its errors give. Private to the speech corpus.
#pragma once

#include <cstdint>

#include "dgc/train/tasks/speech_corpus.h"

namespace dgc::train::speech {

inline constexpr const char* kInstall =
    "install the Debian package espeak-ng (scripts/setup.sh does: apt-get install espeak-ng)";

// splitmix64: a small generator whose output is the same on every platform (the standard
// library's distributions are not).
struct Stream {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [low, high]; the modulo bias is below 1e-17 for these ranges.
  int64_t between(int64_t low, int64_t high) {
    return low + static_cast<int64_t>(next() % static_cast<uint64_t>(high - low + 1));
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

inline Stream utterance_stream(uint64_t seed, Split split, int64_t index) {
  Stream s{seed ^ (0xD6E8FEB86659FD93ull * (static_cast<uint64_t>(split) + 1))};
  s.state ^= 0xA0761D6478BD642Full * static_cast<uint64_t>(index + 1);
  s.next();
  return s;
}

}  // namespace dgc::train::speech
