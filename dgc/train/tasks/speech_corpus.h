// A spoken letters-and-digits corpus (AN4-like) synthesised with espeak-ng, and its log-mel
// features. The speech task (speech.h) trains on it.
//
// Utterances: 3 to 8 tokens, each one of 36 symbols -- a letter a-z or a digit 0-9 -- drawn
// uniformly. Letters are spelled (a run of consecutive letters goes into one SSML
// <say-as interpret-as="characters">, espeak-ng -m); a digit is spoken as its word ("7" ->
// "seven"). The transcript is the token sequence, one symbol per spoken letter or digit.
//
// Speakers: one of the 8 English accents of espeak-ng that sound different (kAccents) with one
// voice variant of espeak-ng-data/voices/!v (`+name`), speed 130-240 words per minute, pitch
// 25-75, amplitude 70-130 and word gap 0-4 (units of 10 ms), all drawn per utterance. The test
// set's variants (kTestVariants) are never used in training (kTrainVariants): the test measures
// speakers the model has not heard. espeak-ng falls back silently to the default voice for an
// unknown variant, so generation first checks that every variant file exists. MBROLA voices
// (mb/...) are never used.
//
// Determinism: utterance i of a split is a function of (seed, split, i) alone (its own random
// stream), espeak-ng's output for the same arguments is the same bytes (checked on Debian's 1.51),
// and the features are computed by one deterministic routine, so the same seed gives the same
// files byte for byte. The noisy test set adds white Gaussian noise at kNoisySnrDb to each test
// waveform (signal power: the mean square of the whole waveform, trailing silence included), the
// noise drawn from the utterance's own stream.
//
// Features (log_mel_features): 22050 Hz audio, frames of 551 samples (25 ms) every 220 samples
// (10 ms), a periodic Hann window, the power spectrum of a 551-point DFT (torch::stft, no
// centering, no padding), 40 triangular mel filters (HTK mel scale, 20 Hz to 8 kHz), log(power +
// 1e-6), then per-utterance normalisation: every band shifted and scaled to mean 0, standard
// deviation 1 over the utterance's frames. The audio itself is not kept.
//
// Cache (a directory per (seed, sizes, version) under the cache directory, never the source tree):
//   speech-v<kCorpusVersion>-seed<S>-train<N>-test<M>/
//     train.features test.features noisy_test.features  (header line, then per utterance an
//                                                        int32 frame count and frames x 40 float32,
//                                                        little-endian)
//     manifest.tsv  (written last: a header with the crc32 of each features file, then one line per
//                    utterance: split, index, accent, variant, speed, pitch, amplitude, word gap,
//                    frames, transcript)
// Generation runs into a temporary directory that is renamed into place when complete, so a
// crashed or concurrent generation never leaves a half corpus behind.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

namespace dgc::train::speech {

inline constexpr int kCorpusVersion = 1;
inline constexpr int kSampleRate = 22050;
inline constexpr int64_t kWindow = 551;  // 25 ms at 22050 Hz
inline constexpr int64_t kHop = 220;     // 10 ms
inline constexpr int64_t kBands = 40;
inline constexpr double kMelLow = 20.0;
inline constexpr double kMelHigh = 8000.0;
inline constexpr double kNoisySnrDb = 15.0;

// The output symbols of the acoustic model: 0 is the CTC blank, 1..26 the letters a-z, 27..36 the
// digits 0-9.
inline constexpr int64_t kSymbols = 37;
inline constexpr int32_t kBlank = 0;
// '_' for the blank, then "abc...z0123456789".
char symbol_char(int32_t symbol);
// The symbol of 'a'-'z' or '0'-'9'; throws dgc::InvalidArgument otherwise.
int32_t symbol_of(char c);
// "seven" for the symbol of '7'; the letter itself for a letter.
std::string spoken_word(int32_t symbol);

inline constexpr const char* kAccents[] = {"en-us",          "en-gb",      "en-gb-scotland",
                                           "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd",
                                           "en-029",         "en-us-nyc"};
inline constexpr const char* kTrainVariants[] = {
    "m1", "m2", "m3",    "m4",     "m5",   "m6",       "f1",    "f2",
    "f3", "f5", "klatt", "klatt2", "adam", "benjamin", "david", "edward"};
inline constexpr const char* kTestVariants[] = {"m7", "f4", "klatt3", "john"};

enum class Split : uint8_t { kTrain, kTest };
const char* to_string(Split split);

// One utterance's words and voice, as generated from (seed, split, index).
struct Utterance {
  Split split = Split::kTrain;
  int64_t index = 0;
  std::vector<int32_t> tokens;  // symbols 1..36
  std::string accent;           // one of kAccents
  std::string variant;          // one of kTrainVariants / kTestVariants, by split
  int speed = 0;                // words per minute, 130..240
  int pitch = 0;                // 25..75
  int amplitude = 0;            // 70..130
  int word_gap = 0;             // 0..4, units of 10 ms
};
Utterance make_utterance(uint64_t seed, Split split, int64_t index);
// The SSML text espeak-ng speaks for `tokens` (with -m).
std::string ssml_text(const std::vector<int32_t>& tokens);
// The transcript: the symbols' characters, e.g. "ab7q".
std::string transcript(const std::vector<int32_t>& tokens);

// Mono 16-bit PCM WAV bytes -> samples in [-1, 1). Throws dgc::DataError naming `what` when the
// bytes are not that format at kSampleRate.
std::vector<float> parse_wav(const std::string& bytes, const std::string& what);

// The features' steps, exposed for the tests. `samples` [n] float32.
torch::Tensor power_spectrum(const torch::Tensor& samples);  // [frames, kWindow / 2 + 1]
torch::Tensor mel_filterbank();                              // [kBands, kWindow / 2 + 1]
double mel_band_center_hz(int64_t band);                     // the peak of band `band`'s triangle
torch::Tensor log_mel(const torch::Tensor& samples);         // [frames, kBands], not normalised
torch::Tensor normalise(const torch::Tensor& features);      // per band: mean 0, std 1
// log_mel then normalise; [0, kBands] when the audio is shorter than one frame.
torch::Tensor log_mel_features(const torch::Tensor& samples);
// `samples` plus white Gaussian noise at `snr_db` below the mean square of `samples`, drawn from
// a stream seeded with `seed`.
torch::Tensor add_noise(const torch::Tensor& samples, double snr_db, uint64_t seed);

struct CorpusOptions {
  std::string cache_dir;             // "" = kjv::default_cache_dir() (the same root as the KJV)
  std::string espeak = "espeak-ng";  // the program, looked up in PATH
  uint64_t seed = 1;                 // the corpus seed (not the training seed)
  int64_t train_utterances = 3000;
  int64_t test_utterances = 500;
  int jobs = 0;  // espeak-ng processes at once; 0 = the cores of this machine
  // Called now and then while generating: (done, total). Null: no progress.
  std::function<void(int64_t, int64_t)> progress;
};

struct Corpus {
  std::vector<Utterance> train, test;  // the same order as the features
  std::vector<torch::Tensor> train_features, test_features, noisy_test_features;  // [frames, 40]
};

// The cache directory of `options` (`cache_dir`/speech-v1-seed<S>-train<N>-test<M>).
std::string corpus_dir(const CorpusOptions& options);

// Loads the corpus, generating it first when corpus_dir(options) does not exist. Throws
// dgc::DataError when espeak-ng cannot be run (install espeak-ng), when a voice variant is missing,
// when espeak-ng fails on an utterance, when the cache cannot be written (pass another directory)
// or is corrupt (delete it: it is generated again).
Corpus load_corpus(const CorpusOptions& options);

}  // namespace dgc::train::speech
