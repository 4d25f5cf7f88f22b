// The speech task: the symbols and SSML of an utterance, the corpus generator (deterministic, test
// voices held out, a clear error without espeak-ng), the log-mel features against a direct DFT
// on a tone, CTC loss against a sum over every alignment, greedy decoding and edit distance on
// hand-made cases, and an untrained model's token error rate against the one after a few hundred
// steps on a small slice.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/tasks/speech.h"
#include "dgc/train/tasks/speech_corpus.h"

namespace dgc::train {
namespace {

namespace fs = std::filesystem;
using namespace speech;

class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ =
        fs::temp_directory_path() / ("dgc_speech_test_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

bool have_espeak() { return std::system("espeak-ng --version >/dev/null 2>&1") == 0; }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<int32_t> symbols(const std::string& text) {
  std::vector<int32_t> out;
  for (char c : text) out.push_back(symbol_of(c));
  return out;
}

TEST(SpeechSymbols, AreBlankLettersAndDigits) {
  ASSERT_EQ(kSymbols, 37);
  std::string all;
  for (int32_t s = 0; s < kSymbols; ++s) all += symbol_char(s);
  EXPECT_EQ(all, "_abcdefghijklmnopqrstuvwxyz0123456789");
  for (int32_t s = 1; s < kSymbols; ++s) EXPECT_EQ(symbol_of(symbol_char(s)), s);
  EXPECT_THROW(symbol_of('A'), InvalidArgument);
  EXPECT_EQ(spoken_word(symbol_of('7')), "seven");
  EXPECT_EQ(spoken_word(symbol_of('0')), "zero");
  EXPECT_EQ(spoken_word(symbol_of('q')), "q");
  // Letter runs go into one say-as element; each digit is its word.
  EXPECT_EQ(ssml_text(symbols("ab7c90")),
            "<speak><say-as interpret-as=\"characters\">ab</say-as> seven "
            "<say-as interpret-as=\"characters\">c</say-as> nine zero</speak>");
  EXPECT_EQ(transcript(symbols("ab7c90")), "ab7c90");
}

TEST(SpeechCorpus, UtterancesAreAFunctionOfTheSeedAndHoldOutTheTestVoices) {
  const std::set<std::string> train_variants(std::begin(kTrainVariants), std::end(kTrainVariants));
  const std::set<std::string> test_variants(std::begin(kTestVariants), std::end(kTestVariants));
  for (const auto& v : test_variants) EXPECT_EQ(train_variants.count(v), 0u) << v;
  std::set<std::string> seen_test, seen_accents;
  int differ = 0;
  for (int64_t i = 0; i < 400; ++i) {
    for (const auto split : {Split::kTrain, Split::kTest}) {
      const auto u = make_utterance(7, split, i);
      const auto again = make_utterance(7, split, i);
      EXPECT_EQ(u.tokens, again.tokens);
      EXPECT_EQ(u.variant, again.variant);
      EXPECT_EQ(u.speed, again.speed);
      EXPECT_GE(u.tokens.size(), 3u);
      EXPECT_LE(u.tokens.size(), 8u);
      for (const int32_t t : u.tokens) EXPECT_TRUE(t >= 1 && t <= 36);
      EXPECT_TRUE(u.speed >= 130 && u.speed <= 240);
      EXPECT_TRUE(u.pitch >= 25 && u.pitch <= 75);
      EXPECT_TRUE(u.amplitude >= 70 && u.amplitude <= 130);
      EXPECT_TRUE(u.word_gap >= 0 && u.word_gap <= 4);
      seen_accents.insert(u.accent);
      if (split == Split::kTrain) {
        EXPECT_EQ(train_variants.count(u.variant), 1u) << u.variant;
      } else {
        EXPECT_EQ(test_variants.count(u.variant), 1u) << u.variant;
        seen_test.insert(u.variant);
      }
      differ += make_utterance(8, split, i).tokens != u.tokens;
    }
  }
  EXPECT_EQ(seen_test, test_variants);
  EXPECT_EQ(seen_accents.size(), std::size(kAccents));
  EXPECT_GT(differ, 700) << "another seed, other utterances";
}

TEST(SpeechCorpus, GenerationIsDeterministicAndTheSplitHoldsOutTheTestVoices) {
  if (!have_espeak()) GTEST_SKIP() << "espeak-ng is not installed (scripts/setup.sh installs it)";
  TempDir a("a"), b("b");
  CorpusOptions options;
  options.seed = 3;
  options.train_utterances = 6;
  options.test_utterances = 4;
  options.cache_dir = a.path().string();
  options.jobs = 2;
  int64_t last = -1;
  options.progress = [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 10);
    EXPECT_GE(done, last);
    last = done;
  };
  const Corpus first = load_corpus(options);
  EXPECT_EQ(last, 10) << "progress reaches the total";
  options.cache_dir = b.path().string();
  options.jobs = 1;  // another schedule, the same bytes
  options.progress = nullptr;
  load_corpus(options);
  const fs::path dir_b = fs::path(corpus_dir(options));
  options.cache_dir = a.path().string();
  const fs::path dir_a = fs::path(corpus_dir(options));
  options.cache_dir = b.path().string();
  for (const char* name :
       {"manifest.tsv", "train.features", "test.features", "noisy_test.features"}) {
    const auto bytes = read_file(dir_a / name);
    EXPECT_GT(bytes.size(), 100u) << name;
    EXPECT_EQ(bytes, read_file(dir_b / name)) << name << " differs between two generations";
  }
  // The manifest names the voices: training variants for training, held-out ones for test.
  std::istringstream manifest(read_file(dir_a / "manifest.tsv"));
  std::string line;
  std::getline(manifest, line);
  int lines = 0;
  while (std::getline(manifest, line)) {
    std::istringstream fields(line);
    std::string split, index, accent, variant;
    fields >> split >> index >> accent >> variant;
    const auto& list =
        split == "train"
            ? std::vector<std::string>(std::begin(kTrainVariants), std::end(kTrainVariants))
            : std::vector<std::string>(std::begin(kTestVariants), std::end(kTestVariants));
    EXPECT_NE(std::find(list.begin(), list.end(), variant), list.end()) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 10);
  ASSERT_EQ(first.train_features.size(), 6u);
  ASSERT_EQ(first.noisy_test_features.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& clean = first.test_features[i];
    EXPECT_EQ(clean.size(1), kBands);
    // Audio of 3+ spoken tokens and the trailing silence: well over half a second.
    EXPECT_GT(clean.size(0), 50);
    EXPECT_EQ(clean.sizes(), first.noisy_test_features[i].sizes());
    EXPECT_FALSE(torch::allclose(clean, first.noisy_test_features[i]));
  }
  // A loaded cache gives the same features; a damaged one is refused with the remedy.
  const Corpus reloaded = load_corpus(options);
  EXPECT_TRUE(torch::equal(reloaded.train_features[5], first.train_features[5]));
  {
    std::ofstream out(dir_b / "test.features", std::ios::binary | std::ios::app);
    out << "x";
  }
  try {
    load_corpus(options);
    ADD_FAILURE() << "a damaged corpus was loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("delete the directory"), std::string::npos) << e.what();
  }
}

TEST(SpeechCorpus, MissingEspeakSaysWhatToInstall) {
  TempDir dir("missing");
  CorpusOptions options;
  options.cache_dir = dir.path().string();
  options.espeak = "dgc-no-such-espeak-ng";
  options.train_utterances = 2;
  options.test_utterances = 1;
  try {
    load_corpus(options);
    ADD_FAILURE() << "no error without espeak-ng";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install espeak-ng"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(corpus_dir(options))) << "no half corpus left behind";
}

TEST(SpeechWav, ParsesPcmAndRefusesOtherFormats) {
  const auto wav = [](uint16_t format, uint16_t channels, uint32_t rate, uint16_t bits,
                      const std::vector<int16_t>& samples) {
    std::string out = "RIFF";
    const auto u32 = [&](uint32_t v) {
      for (int k = 0; k < 4; ++k) out += static_cast<char>(v >> (8 * k));
    };
    const auto u16 = [&](uint16_t v) {
      for (int k = 0; k < 2; ++k) out += static_cast<char>(v >> (8 * k));
    };
    u32(36 + 2 * static_cast<uint32_t>(samples.size()));
    out += "WAVEfmt ";
    u32(16);
    u16(format);
    u16(channels);
    u32(rate);
    u32(rate * 2);
    u16(2);
    u16(bits);
    out += "data";
    u32(2 * static_cast<uint32_t>(samples.size()));
    for (const int16_t s : samples) u16(static_cast<uint16_t>(s));
    return out;
  };
  const auto samples = parse_wav(wav(1, 1, 22050, 16, {0, 16384, -32768, 32767}), "x.wav");
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(samples[1], 0.5f);
  EXPECT_EQ(samples[2], -1.0f);
  EXPECT_THROW(parse_wav(wav(1, 2, 22050, 16, {0, 0}), "x.wav"), DataError);
  EXPECT_THROW(parse_wav(wav(1, 1, 16000, 16, {0, 0}), "x.wav"), DataError);
  EXPECT_THROW(parse_wav("RIFF....WAVE", "x.wav"), DataError);
  EXPECT_THROW(parse_wav("", "x.wav"), DataError);
}

TEST(SpeechFeatures, MatchADirectDftOnATone) {
  // A tone at the centre of mel band 12, 0.3 s.
  const double hz = mel_band_center_hz(12);
  const int64_t n = kSampleRate * 3 / 10;
  auto samples = torch::empty({n}, torch::kFloat32);
  for (int64_t i = 0; i < n; ++i) {
    samples[i] = static_cast<float>(0.5 * std::sin(2.0 * M_PI * hz * i / kSampleRate));
  }
  const auto power = power_spectrum(samples);
  const int64_t frames = 1 + (n - kWindow) / kHop;
  ASSERT_EQ(power.sizes(), (std::vector<int64_t>{frames, kWindow / 2 + 1}));
  // Reference: the DFT of each Hann-windowed frame, written out, in double.
  const int64_t bins = kWindow / 2 + 1;
  std::vector<double> window(kWindow);
  for (int64_t j = 0; j < kWindow; ++j) window[j] = 0.5 - 0.5 * std::cos(2.0 * M_PI * j / kWindow);
  const auto bank = mel_filterbank();
  auto reference_log_mel = torch::empty({frames, kBands}, torch::kFloat64);
  double worst = 0.0;
  double peak = 0.0;
  for (int64_t t : {int64_t{0}, frames / 2, frames - 1}) {
    std::vector<double> reference(bins);
    for (int64_t k = 0; k < bins; ++k) {
      std::complex<double> sum = 0.0;
      for (int64_t j = 0; j < kWindow; ++j) {
        sum += window[j] * samples[t * kHop + j].item<double>() *
               std::polar(1.0, -2.0 * M_PI * static_cast<double>(k * j) / kWindow);
      }
      reference[k] = std::norm(sum);
      peak = std::max(peak, reference[k]);
      worst = std::max(worst, std::abs(reference[k] - power[t][k].item<double>()));
    }
    for (int64_t b = 0; b < kBands; ++b) {
      double energy = 0.0;
      for (int64_t k = 0; k < bins; ++k) energy += bank[b][k].item<double>() * reference[k];
      reference_log_mel[t][b] = std::log(energy + 1e-6);
    }
  }
  EXPECT_LT(worst, 1e-4 * peak) << "power spectrum differs from the direct DFT";
  const auto computed = log_mel(samples);
  ASSERT_EQ(computed.sizes(), (std::vector<int64_t>{frames, kBands}));
  for (int64_t t : {int64_t{0}, frames / 2, frames - 1}) {
    // Bands far from the tone hold little energy, where float rounding dominates the log.
    for (int64_t b = 8; b < 17; ++b) {
      EXPECT_NEAR(computed[t][b].item<double>(), reference_log_mel[t][b].item<double>(), 1e-3)
          << "frame " << t << " band " << b;
    }
    EXPECT_EQ(computed[t].argmax().item<int64_t>(), 12) << "the tone's band peaks";
  }
  // The filterbank: triangles of height 1 at their centres, covering 20 Hz to 8 kHz.
  for (int64_t b = 0; b < kBands; ++b) {
    EXPECT_LE(bank[b].max().item<double>(), 1.0 + 1e-6);
    EXPECT_GT(bank[b].max().item<double>(), 0.3) << "band " << b << " catches some bin";
  }
  // Normalised: every band mean 0, standard deviation 1 over the utterance.
  auto noisy = add_noise(samples, 15.0, 1);
  const auto features = log_mel_features(noisy);
  EXPECT_LT(features.mean(0).abs().max().item<double>(), 1e-4);
  EXPECT_LT((features.std(0, false) - 1).abs().max().item<double>(), 1e-3);
  // 15 dB: noise power a 31.6th of the signal's.
  const double signal = samples.pow(2).mean().item<double>();
  const double noise = (noisy - samples).pow(2).mean().item<double>();
  EXPECT_NEAR(10 * std::log10(signal / noise), 15.0, 0.3);
  EXPECT_TRUE(torch::equal(noisy, add_noise(samples, 15.0, 1))) << "the seed fixes the noise";
  EXPECT_EQ(log_mel_features(torch::zeros({100})).size(0), 0) << "shorter than a frame";
}

// -log of the summed probability of every alignment of length T that collapses to `target`.
double brute_force_ctc(const torch::Tensor& log_probs, const std::vector<int32_t>& target) {
  const int64_t steps = log_probs.size(0);
  const int64_t classes = log_probs.size(1);
  double total = 0.0;
  std::vector<int64_t> path(static_cast<size_t>(steps), 0);
  std::function<void(int64_t)> visit = [&](int64_t t) {
    if (t == steps) {
      std::vector<int32_t> collapsed;
      int64_t previous = -1;
      double logp = 0.0;
      for (int64_t s = 0; s < steps; ++s) {
        logp += log_probs[s][path[s]].item<double>();
        if (path[s] != previous && path[s] != 0) collapsed.push_back(static_cast<int32_t>(path[s]));
        previous = path[s];
      }
      if (collapsed == target) total += std::exp(logp);
      return;
    }
    for (int64_t c = 0; c < classes; ++c) {
      path[static_cast<size_t>(t)] = c;
      visit(t + 1);
    }
  };
  visit(0);
  return -std::log(total);
}

TEST(SpeechCtc, LossIsTheSumOverAlignmentsAndDecodingCollapses) {
  torch::manual_seed(5);
  // Two utterances: 5 and 4 steps over 4 classes (blank and 3 symbols), targets "1 2 2" and "3".
  const auto log_probs = torch::log_softmax(torch::randn({5, 2, 4}, torch::kFloat64), 2);
  const auto steps = torch::tensor({5, 4}, torch::kInt64);
  const std::vector<std::vector<int32_t>> targets = {{1, 2, 2}, {3}};
  const double first = brute_force_ctc(log_probs.select(1, 0), targets[0]);
  const double second = brute_force_ctc(log_probs.select(1, 1).slice(0, 0, 4), targets[1]);
  // reduction mean: each loss over its target length, then the mean over the batch.
  EXPECT_NEAR(ctc_loss(log_probs, steps, targets).item<double>(),
              (first / 3.0 + second / 1.0) / 2.0, 1e-9);
  // Too few steps for "1 2 2" (it needs a blank between the 2s): zeroed, not infinite.
  const auto short_steps = torch::tensor({2, 4}, torch::kInt64);
  EXPECT_NEAR(ctc_loss(log_probs, short_steps, targets).item<double>(), second / 2.0, 1e-9);

  const auto one_hot = [](const std::vector<int64_t>& path) {
    auto t = torch::full({static_cast<int64_t>(path.size()), kSymbols}, -10.0);
    for (size_t s = 0; s < path.size(); ++s) t[static_cast<int64_t>(s)][path[s]] = 0.0;
    return t;
  };
  EXPECT_EQ(greedy_decode(one_hot({1, 1, 0, 2, 2, 0, 2, 0}), 8), (std::vector<int32_t>{1, 2, 2}));
  EXPECT_EQ(greedy_decode(one_hot({0, 0, 0}), 3), std::vector<int32_t>{});
  EXPECT_EQ(greedy_decode(one_hot({5, 5, 5, 7}), 3), std::vector<int32_t>{5}) << "steps cut";
  EXPECT_EQ(edit_distance(symbols("abc"), symbols("abc")), 0);
  EXPECT_EQ(edit_distance(symbols("abc"), symbols("axc")), 1);
  EXPECT_EQ(edit_distance(symbols("abc"), symbols("")), 3);
  EXPECT_EQ(edit_distance(symbols(""), symbols("ab")), 2);
  EXPECT_EQ(edit_distance(symbols("kitten"), symbols("sitting")), 3);
  EXPECT_EQ(edit_distance(symbols("7a7"), symbols("a77")), 2);
}

TEST(GruCtcModel, HasTheDocumentedSize) {
  GruCtcModel model(128, 3, 3, 1);
  int64_t total = 0, one_d = 0, two_d_tensors = 0;
  for (const auto& p : model.parameters()) {
    total += p.numel();
    one_d += p.dim() == 1 ? p.numel() : 0;
    two_d_tensors += p.dim() == 2;
  }
  EXPECT_EQ(total, 794405);
  EXPECT_EQ(one_d, 4645);
  EXPECT_EQ(two_d_tensors, 13);
  // Same seed, same weights; the output is [steps, batch, 37] log-probabilities, steps per input.
  GruCtcModel a(8, 2, 3, 4), b(8, 2, 3, 4);
  const auto pa = a.parameters();
  const auto pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
  const auto [log_probs, steps] =
      a.forward({torch::randn({10, kBands}), torch::randn({4, kBands})});
  EXPECT_EQ(log_probs.sizes(), (std::vector<int64_t>{4, 2, kSymbols}));
  EXPECT_EQ(steps[0].item<int64_t>(), 4);
  EXPECT_EQ(steps[1].item<int64_t>(), 2);
  EXPECT_NEAR(log_probs[0][0].exp().sum().item<double>(), 1.0, 1e-5);
  // Padding does not change an utterance's output: alone, the short one gives the same.
  torch::manual_seed(9);
  const auto x = torch::randn({4, kBands});
  const auto together = a.forward({torch::randn({10, kBands}), x}).first;
  const auto single = a.forward({x}).first;
  EXPECT_TRUE(
      torch::allclose(together.select(1, 1).slice(0, 0, 2), single.select(1, 0), 1e-5, 1e-6));
}

TEST(GruCtcModel, TrainingOnASmallSliceLowersTheTokenErrorRate) {
  if (!have_espeak()) GTEST_SKIP() << "espeak-ng is not installed (scripts/setup.sh installs it)";
  TempDir dir("train");
  CorpusOptions options;
  options.cache_dir = dir.path().string();
  options.train_utterances = 6;
  options.test_utterances = 1;
  const Corpus corpus = load_corpus(options);
  std::vector<std::vector<int32_t>> references;
  for (const auto& u : corpus.train) references.push_back(u.tokens);
  torch::manual_seed(1);
  GruCtcModel model(48, 1, 3, 2);
  const auto untrained = count_errors(model, corpus.train_features, references, 8);
  const double before = untrained.token_errors / untrained.reference_tokens;
  EXPECT_GT(before, 0.85) << "an untrained model decodes nothing right";
  EXPECT_EQ(untrained.utterance_errors, untrained.utterances);
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(3e-3));
  double first_loss = 0.0, last_loss = 0.0;
  for (int step = 0; step < 300; ++step) {
    optimizer.zero_grad();
    const auto [log_probs, steps] = model.forward(corpus.train_features);
    const auto loss = ctc_loss(log_probs, steps, references);
    loss.backward();
    optimizer.step();
    (step == 0 ? first_loss : last_loss) = loss.item<double>();
  }
  const auto trained = count_errors(model, corpus.train_features, references, 8);
  const double after = trained.token_errors / trained.reference_tokens;
  EXPECT_LT(last_loss, 0.5 * first_loss);
  EXPECT_LT(after, before - 0.4) << "TER before " << before << ", after " << after;
}

}  // namespace
}  // namespace dgc::train
