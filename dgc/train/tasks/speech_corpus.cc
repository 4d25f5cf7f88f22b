#include "dgc/train/tasks/speech_corpus.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "dgc/core/crc32.h"
#include "dgc/core/error.h"
#include "dgc/train/tasks/kjv.h"

extern char** environ;

namespace dgc::train::speech {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInstall =
    "install the Debian package espeak-ng (scripts/setup.sh does: apt-get install espeak-ng)";
constexpr const char* kDigitWords[] = {"zero", "one", "two",   "three", "four",
                                       "five", "six", "seven", "eight", "nine"};

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

Stream utterance_stream(uint64_t seed, Split split, int64_t index) {
  Stream s{seed ^ (0xD6E8FEB86659FD93ull * (static_cast<uint64_t>(split) + 1))};
  s.state ^= 0xA0761D6478BD642Full * static_cast<uint64_t>(index + 1);
  s.next();
  return s;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.flush();
  if (!out) {
    throw DataError("cannot write " + path.string() +
                    " of the speech corpus: pass a writable cache directory (--cache-dir DIR)");
  }
}

// Runs `argv` (no shell) with stdout and stderr into `log`; returns its wait status. Throws
// dgc::DataError when the program cannot be started.
int run_program(const std::vector<std::string>& argv, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int error = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    throw DataError(detail::concat("cannot run '", argv[0], "' (", std::strerror(error),
                                   ") to generate the speech corpus: ", kInstall));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw DataError("waitpid on '" + argv[0] + "' failed");
  }
  return status;
}

std::string describe_failure(const std::string& program, int status, const fs::path& log) {
  std::string output = read_file(log);
  output = output.substr(0, output.find('\n'));
  return detail::concat("'", program, "' failed (",
                        WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                          : "killed by signal " + std::to_string(WTERMSIG(status)),
                        output.empty() ? "" : ": " + output, ")");
}

// espeak-ng's data directory, from `espeak-ng --version` ("... Data at: /usr/lib/.../data").
fs::path espeak_data_dir(const std::string& espeak, const fs::path& work) {
  const fs::path log = work / "version.txt";
  const int status = run_program({espeak, "--version"}, log);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw DataError(describe_failure(espeak, status, log) + "; " + kInstall);
  }
  const std::string text = read_file(log);
  const std::string key = "Data at: ";
  const size_t at = text.find(key);
  if (at == std::string::npos) {
    throw DataError("'" + espeak + " --version' did not say where its data is ('" +
                    text.substr(0, text.find('\n')) + "'): " + kInstall);
  }
  std::string dir = text.substr(at + key.size());
  dir = dir.substr(0, dir.find_first_of("\r\n"));
  return fs::path(dir);
}

void check_voices(const fs::path& data) {
  std::vector<std::string> missing;
  std::vector<const char*> variants(std::begin(kTrainVariants), std::end(kTrainVariants));
  variants.insert(variants.end(), std::begin(kTestVariants), std::end(kTestVariants));
  for (const char* variant : variants) {
    if (!fs::exists(data / "voices" / "!v" / variant)) missing.emplace_back(variant);
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
    throw DataError("espeak-ng's voice variants " + names + " are missing from " +
                    (data / "voices" / "!v").string() +
                    " (espeak-ng would fall back to its default voice silently): install the "
                    "Debian package espeak-ng-data 1.51 or later");
  }
}

void append_features(std::string& out, const torch::Tensor& features) {
  const auto f = features.contiguous();
  const auto frames = static_cast<int32_t>(f.size(0));
  out.append(reinterpret_cast<const char*>(&frames), sizeof(frames));
  out.append(reinterpret_cast<const char*>(f.data_ptr<float>()), f.numel() * sizeof(float));
}

std::string features_header(int64_t count) {
  return detail::concat("dgc-speech-features ", kCorpusVersion, " utterances ", count, " bands ",
                        kBands, "\n");
}

std::vector<torch::Tensor> parse_features(const std::string& bytes, int64_t count,
                                          const std::string& path) {
  const auto corrupt = [&](const std::string& what) {
    return DataError("the speech corpus file " + path + " is corrupt (" + what +
                     "): delete its directory and it is generated again on the next run");
  };
  const std::string header = features_header(count);
  if (bytes.compare(0, header.size(), header) != 0) throw corrupt("unexpected header");
  std::vector<torch::Tensor> out;
  size_t at = header.size();
  for (int64_t i = 0; i < count; ++i) {
    int32_t frames = 0;
    if (at + sizeof(frames) > bytes.size()) throw corrupt("truncated");
    std::memcpy(&frames, bytes.data() + at, sizeof(frames));
    at += sizeof(frames);
    const size_t n = static_cast<size_t>(frames) * kBands * sizeof(float);
    if (frames < 0 || at + n > bytes.size()) throw corrupt("truncated");
    auto t = torch::empty({frames, kBands}, torch::kFloat32);
    std::memcpy(t.data_ptr<float>(), bytes.data() + at, n);
    at += n;
    out.push_back(t);
  }
  if (at != bytes.size()) throw corrupt("trailing bytes");
  return out;
}

std::string manifest_line(const Utterance& u, int64_t frames) {
  return detail::concat(to_string(u.split), '\t', u.index, '\t', u.accent, '\t', u.variant, '\t',
                        u.speed, '\t', u.pitch, '\t', u.amplitude, '\t', u.word_gap, '\t', frames,
                        '\t', transcript(u.tokens), '\n');
}

// Synthesises utterance `u` into `wav` and returns its samples.
std::vector<float> synthesise(const std::string& espeak, const Utterance& u, const fs::path& wav) {
  const fs::path log = wav.string() + ".log";
  const std::vector<std::string> argv = {espeak,
                                         "-m",
                                         "-v",
                                         u.accent + "+" + u.variant,
                                         "-s",
                                         std::to_string(u.speed),
                                         "-p",
                                         std::to_string(u.pitch),
                                         "-a",
                                         std::to_string(u.amplitude),
                                         "-g",
                                         std::to_string(u.word_gap),
                                         "-w",
                                         wav.string(),
                                         ssml_text(u.tokens)};
  const int status = run_program(argv, log);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw DataError(describe_failure(espeak, status, log) + " on " + to_string(u.split) +
                    " utterance " + std::to_string(u.index) + " ('" + transcript(u.tokens) +
                    "', voice " + u.accent + "+" + u.variant + "): " + kInstall);
  }
  auto samples = parse_wav(read_file(wav), wav.string());
  std::error_code ignored;
  fs::remove(wav, ignored);
  fs::remove(log, ignored);
  return samples;
}

void generate(const CorpusOptions& options, const fs::path& work) {
  check_voices(espeak_data_dir(options.espeak, work));
  std::vector<Utterance> all;
  for (int64_t i = 0; i < options.train_utterances; ++i) {
    all.push_back(make_utterance(options.seed, Split::kTrain, i));
  }
  for (int64_t i = 0; i < options.test_utterances; ++i) {
    all.push_back(make_utterance(options.seed, Split::kTest, i));
  }
  const auto total = static_cast<int64_t>(all.size());
  std::vector<torch::Tensor> clean(all.size()), noisy(all.size());
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  const int jobs = options.jobs > 0
                       ? options.jobs
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto work_loop = [&](int job) {
    const fs::path wav = work / ("job" + std::to_string(job) + ".wav");
    try {
      for (int64_t i = next++; i < total; i = next++) {
        const Utterance& u = all[static_cast<size_t>(i)];
        const auto samples = synthesise(options.espeak, u, wav);
        const auto wave = torch::from_blob(const_cast<float*>(samples.data()),
                                           {static_cast<int64_t>(samples.size())}, torch::kFloat32)
                              .clone();
        clean[static_cast<size_t>(i)] = log_mel_features(wave);
        if (u.split == Split::kTest) {
          const uint64_t noise_seed =
              utterance_stream(options.seed, u.split, u.index).next() ^ 0x5EEDull;
          noisy[static_cast<size_t>(i)] =
              log_mel_features(add_noise(wave, kNoisySnrDb, noise_seed));
        }
        ++done;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = total;  // the other jobs stop after their current utterance
    }
  };
  {
    std::vector<std::thread> threads;
    for (int j = 0; j < jobs; ++j) threads.emplace_back(work_loop, j);
    // Progress from this thread, about twice a second, until every job is done or one failed.
    int64_t shown = -1;
    while (true) {
      const int64_t now = done.load();
      if (options.progress && now != shown) {
        options.progress(now, total);
        shown = now;
      }
      if (now >= total) break;
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    for (auto& t : threads) t.join();
  }
  if (error) std::rethrow_exception(error);

  std::string train_bytes = features_header(options.train_utterances);
  std::string test_bytes = features_header(options.test_utterances);
  std::string noisy_bytes = test_bytes;
  std::string lines;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool test = all[i].split == Split::kTest;
    append_features(test ? test_bytes : train_bytes, clean[i]);
    if (test) append_features(noisy_bytes, noisy[i]);
    lines += manifest_line(all[i], clean[i].size(0));
  }
  write_file(work / "train.features", train_bytes);
  write_file(work / "test.features", test_bytes);
  write_file(work / "noisy_test.features", noisy_bytes);
  char crcs[64];
  std::snprintf(crcs, sizeof(crcs), "%08x %08x %08x", crc32_of(train_bytes), crc32_of(test_bytes),
                crc32_of(noisy_bytes));
  write_file(work / "manifest.tsv",
             detail::concat("dgc-speech-corpus ", kCorpusVersion, " seed ", options.seed, " train ",
                            options.train_utterances, " test ", options.test_utterances, " crc32 ",
                            crcs, "\n", lines));
  std::error_code ignored;
  fs::remove(work / "version.txt", ignored);
}

Corpus read_corpus(const CorpusOptions& options, const fs::path& dir) {
  const std::string manifest_path = (dir / "manifest.tsv").string();
  const std::string manifest = read_file(manifest_path);
  const auto corrupt = [&](const std::string& what) {
    return DataError("the speech corpus " + dir.string() + " is corrupt (" + what +
                     "): delete the directory and it is generated again on the next run");
  };
  const size_t end = manifest.find('\n');
  if (end == std::string::npos) throw corrupt("no manifest.tsv header");
  Corpus corpus;
  const std::string names[] = {"train.features", "test.features", "noisy_test.features"};
  std::string bytes[3];
  char crcs[64] = "";
  for (int k = 0; k < 3; ++k) {
    bytes[k] = read_file(dir / names[k]);
    std::snprintf(crcs + std::strlen(crcs), sizeof(crcs) - std::strlen(crcs), k ? " %08x" : "%08x",
                  crc32_of(bytes[k]));
  }
  const std::string expected =
      detail::concat("dgc-speech-corpus ", kCorpusVersion, " seed ", options.seed, " train ",
                     options.train_utterances, " test ", options.test_utterances, " crc32 ", crcs);
  if (manifest.substr(0, end) != expected) {
    throw corrupt("manifest header '" + manifest.substr(0, end) + "', the files give '" + expected +
                  "'");
  }
  corpus.train_features = parse_features(bytes[0], options.train_utterances, names[0]);
  corpus.test_features = parse_features(bytes[1], options.test_utterances, names[1]);
  corpus.noisy_test_features = parse_features(bytes[2], options.test_utterances, names[2]);
  // The utterances are a function of the seed: rebuild them and check the manifest agrees.
  std::string lines;
  for (int64_t i = 0; i < options.train_utterances; ++i) {
    corpus.train.push_back(make_utterance(options.seed, Split::kTrain, i));
    lines +=
        manifest_line(corpus.train.back(), corpus.train_features[static_cast<size_t>(i)].size(0));
  }
  for (int64_t i = 0; i < options.test_utterances; ++i) {
    corpus.test.push_back(make_utterance(options.seed, Split::kTest, i));
    lines +=
        manifest_line(corpus.test.back(), corpus.test_features[static_cast<size_t>(i)].size(0));
  }
  if (manifest.substr(end + 1) != lines) {
    throw corrupt("manifest.tsv does not list the utterances of seed " +
                  std::to_string(options.seed) + " (written by another version?)");
  }
  return corpus;
}

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

std::vector<float> parse_wav(const std::string& bytes, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return DataError("espeak-ng's output " + what + " is not a 16-bit mono " +
                     std::to_string(kSampleRate) + " Hz WAV file (" + why + "): " + kInstall);
  };
  const auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(bytes[at + k]);
    return v;
  };
  const auto u16 = [&](size_t at) {
    return static_cast<uint16_t>(static_cast<uint8_t>(bytes[at]) |
                                 (static_cast<uint8_t>(bytes[at + 1]) << 8));
  };
  if (bytes.size() < 12 || bytes.compare(0, 4, "RIFF") != 0 || bytes.compare(8, 4, "WAVE") != 0) {
    throw bad("no RIFF/WAVE header");
  }
  bool format_seen = false;
  size_t at = 12;
  while (at + 8 <= bytes.size()) {
    const std::string id = bytes.substr(at, 4);
    const size_t size = u32(at + 4);
    const size_t body = at + 8;
    if (id == "fmt ") {
      if (size < 16 || body + 16 > bytes.size()) throw bad("short fmt chunk");
      if (u16(body) != 1 || u16(body + 2) != 1 || u32(body + 4) != kSampleRate ||
          u16(body + 14) != 16) {
        throw bad("format " + std::to_string(u16(body)) + ", " + std::to_string(u16(body + 2)) +
                  " channels, " + std::to_string(u32(body + 4)) + " Hz, " +
                  std::to_string(u16(body + 14)) + " bits");
      }
      format_seen = true;
    } else if (id == "data") {
      if (!format_seen) throw bad("data before fmt");
      // A streamed file may carry a placeholder size: take what is there.
      const size_t n = std::min(size, bytes.size() - body) / 2;
      std::vector<float> samples(n);
      for (size_t i = 0; i < n; ++i) {
        samples[i] = static_cast<float>(static_cast<int16_t>(u16(body + 2 * i))) / 32768.0f;
      }
      return samples;
    }
    at = body + size + (size & 1);
  }
  throw bad("no data chunk");
}

torch::Tensor power_spectrum(const torch::Tensor& samples) {
  DGC_CHECK(samples.dim() == 1, "power_spectrum takes a 1-D waveform");
  if (samples.size(0) < kWindow) return torch::zeros({0, kWindow / 2 + 1});
  const auto window = torch::hann_window(kWindow, /*periodic=*/true, torch::kFloat32);
  const auto spectrum = torch::stft(samples.to(torch::kFloat32), kWindow, kHop, kWindow, window,
                                    /*normalized=*/false, /*onesided=*/true,
                                    /*return_complex=*/true);  // [bins, frames], no centering
  return spectrum.abs().pow(2).t().contiguous();
}

namespace {
double hz_to_mel(double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); }
double mel_to_hz(double mel) { return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0); }
}  // namespace

double mel_band_center_hz(int64_t band) {
  const double low = hz_to_mel(kMelLow);
  const double high = hz_to_mel(kMelHigh);
  return mel_to_hz(low + (high - low) * static_cast<double>(band + 1) / (kBands + 1));
}

torch::Tensor mel_filterbank() {
  const int64_t bins = kWindow / 2 + 1;
  auto bank = torch::zeros({kBands, bins}, torch::kFloat32);
  auto a = bank.accessor<float, 2>();
  for (int64_t b = 0; b < kBands; ++b) {
    const double left = b == 0 ? kMelLow : mel_band_center_hz(b - 1);
    const double center = mel_band_center_hz(b);
    const double right = b + 1 == kBands ? kMelHigh : mel_band_center_hz(b + 1);
    for (int64_t k = 0; k < bins; ++k) {
      const double hz = static_cast<double>(k) * kSampleRate / kWindow;
      double w = 0.0;
      if (hz > left && hz <= center) w = (hz - left) / (center - left);
      if (hz > center && hz < right) w = (right - hz) / (right - center);
      a[b][k] = static_cast<float>(w);
    }
  }
  return bank;
}

torch::Tensor log_mel(const torch::Tensor& samples) {
  static const torch::Tensor bank = mel_filterbank();
  return torch::log(torch::mm(power_spectrum(samples), bank.t()) + 1e-6);
}

torch::Tensor normalise(const torch::Tensor& features) {
  if (features.size(0) == 0) return features;
  const auto mean = features.mean(0, /*keepdim=*/true);
  const auto std = features.std(0, /*unbiased=*/false, /*keepdim=*/true);
  return ((features - mean) / (std + 1e-5)).contiguous();
}

torch::Tensor log_mel_features(const torch::Tensor& samples) { return normalise(log_mel(samples)); }

torch::Tensor add_noise(const torch::Tensor& samples, double snr_db, uint64_t seed) {
  auto out = samples.to(torch::kFloat32).contiguous().clone();
  float* x = out.data_ptr<float>();
  const int64_t n = out.numel();
  double power = 0.0;
  for (int64_t i = 0; i < n; ++i) power += static_cast<double>(x[i]) * x[i];
  power = n > 0 ? power / static_cast<double>(n) : 0.0;
  const double sigma = std::sqrt(power / std::pow(10.0, snr_db / 10.0));
  Stream s{seed};
  for (int64_t i = 0; i < n; i += 2) {
    // Box-Muller: two normal draws from two uniforms.
    const double u1 = 1.0 - s.uniform();
    const double u2 = s.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    x[i] += static_cast<float>(sigma * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) x[i + 1] += static_cast<float>(sigma * r * std::sin(2.0 * M_PI * u2));
  }
  return out;
}

std::string corpus_dir(const CorpusOptions& options) {
  const std::string root = options.cache_dir.empty() ? kjv::default_cache_dir() : options.cache_dir;
  return (fs::path(root) / detail::concat("speech-v", kCorpusVersion, "-seed", options.seed,
                                          "-train", options.train_utterances, "-test",
                                          options.test_utterances))
      .string();
}

Corpus load_corpus(const CorpusOptions& options) {
  DGC_CHECK_GE(options.train_utterances, 1, "training utterances");
  DGC_CHECK_GE(options.test_utterances, 1, "test utterances");
  const fs::path dir = corpus_dir(options);
  std::error_code error;
  if (!fs::exists(dir / "manifest.tsv", error)) {
    const fs::path work = dir.string() + ".tmp" + std::to_string(::getpid());
    fs::remove_all(work, error);
    fs::create_directories(work, error);
    if (error) {
      throw DataError("cannot create " + work.string() + " (" + error.message() +
                      "): pass a writable cache directory (--cache-dir DIR)");
    }
    try {
      generate(options, work);
    } catch (...) {
      fs::remove_all(work, error);
      throw;
    }
    fs::rename(work, dir, error);
    if (error) {
      // Another process put a complete corpus there first; this copy is the same bytes.
      fs::remove_all(work, error);
      if (!fs::exists(dir / "manifest.tsv", error)) {
        throw DataError("cannot move the speech corpus into place at " + dir.string() +
                        ": delete it or pass another cache directory (--cache-dir DIR)");
      }
    }
  }
  return read_corpus(options, dir);
}

}  // namespace dgc::train::speech
