// The speech corpus on disk (speech_corpus.h): generation with espeak-ng into a temporary
// directory, the cache, and reading a cached corpus back with its checks. The utterances are
// drawn in speech_utterances.cc, the audio and features computed in speech_audio.cc.
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
#include "dgc/train/tasks/speech_corpus_internal.h"

extern char** environ;

namespace dgc::train::speech {
namespace {

namespace fs = std::filesystem;

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
