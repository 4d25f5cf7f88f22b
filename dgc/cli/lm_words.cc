// dgc lm-words: where a trained language model loses, by word frequency. Loads the weights of one
// or more `dgc train --task lm` checkpoints (any rank's file: all ranks hold the same weights),
// evaluates the test (or validation) verses exactly as the run did -- the same world size, batch
// columns and carried state, read from the checkpoint's settings -- and prints a markdown table
// of the loss per band of word frequency (<eos>, the 10 most frequent words, the next 90, ...,
// <unk>). With two or more checkpoints it also says how much of the gap between the first and
// each other one every band accounts for: the question is whether DGC, which sends a word's
// embedding and decoder rows only when they reach the top 0.1%, loses on rare words.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dgc/cli/commands.h"
#include "dgc/core/error.h"
#include "dgc/core/key_value.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/tasks/lm.h"

namespace dgc::cli {
namespace {

struct LmWordsCommand {
  std::vector<std::string> checkpoints;
  std::vector<std::string> labels;
  std::string part = "test";
  std::string cache_dir;
};

// What a checkpoint says about its run: KEY=VALUE lines of "optimizer/settings".
std::map<std::string, std::string> settings_of(const train::CheckpointFile& file) {
  return parse_key_value_lines(file.text("optimizer/settings"));
}

int64_t setting(const std::map<std::string, std::string>& settings, const std::string& key,
                const std::string& path) {
  const auto it = settings.find(key);
  if (it == settings.end()) {
    throw DataError("checkpoint " + path + " does not record '" + key +
                    "': is it a checkpoint of `dgc train --task lm`?");
  }
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw DataError("checkpoint " + path + ": setting '" + key + "' is '" + it->second +
                    "', not a number");
  }
}

// One evaluated checkpoint: the summed loss and token count per band, and in all.
struct Evaluated {
  std::string label;
  std::vector<double> nll;
  std::vector<int64_t> tokens;
  double total_nll = 0.0;
  int64_t total_tokens = 0;
  double perplexity() const { return std::exp(total_nll / static_cast<double>(total_tokens)); }
};

// The settings that decide what is evaluated and how; every checkpoint must agree on them.
const std::vector<std::string> kLayoutKeys = {"vocabulary", "embedding",  "hidden",
                                              "bptt",       "batch_size", "test_examples"};

void run(const LmWordsCommand& cmd) {
  if (!cmd.labels.empty() && cmd.labels.size() != cmd.checkpoints.size()) {
    throw InvalidArgument(detail::concat("--label is given ", cmd.labels.size(), " times for ",
                                         cmd.checkpoints.size(),
                                         " checkpoints: give one per checkpoint, or none"));
  }
  const auto part =
      cmd.part == "validation" ? train::kjv::Part::kValidation : train::kjv::Part::kTest;
  std::vector<train::CheckpointFile> files;
  std::map<std::string, std::string> layout;  // of the first checkpoint
  int world = 0;
  for (const auto& path : cmd.checkpoints) {
    files.push_back(train::CheckpointFile::read(path));
    const auto settings = settings_of(files.back());
    const auto task = settings.find("task");
    if (task == settings.end() || task->second != "lm") {
      throw InvalidArgument("checkpoint " + path + " is not of an lm run (task '" +
                            (task == settings.end() ? std::string() : task->second) +
                            "'): dgc lm-words reads checkpoints of `dgc train --task lm`");
    }
    const int w = static_cast<int>(train::read_int(files.back(), "optimizer/world_size"));
    if (files.size() == 1) {
      world = w;
      for (const auto& key : kLayoutKeys)
        layout[key] = std::to_string(setting(settings, key, path));
    } else {
      for (const auto& key : kLayoutKeys) {
        if (std::to_string(setting(settings, key, path)) != layout[key]) {
          throw InvalidArgument(detail::concat("checkpoint ", path, " has ", key, "=",
                                               settings.at(key), ", the first one ", layout[key],
                                               ": compare runs of the same model and data"));
        }
      }
      if (w != world) {
        throw InvalidArgument(detail::concat("checkpoint ", path, " is of ", w,
                                             " workers, the first one of ", world,
                                             ": the evaluation layout would differ"));
      }
    }
  }
  train::LmOptions lm;
  lm.cache_dir = cmd.cache_dir;
  lm.vocabulary = std::stoll(layout["vocabulary"]);
  lm.embedding = std::stoll(layout["embedding"]);
  lm.hidden = std::stoll(layout["hidden"]);
  lm.bptt = std::stoll(layout["bptt"]);
  const int64_t batch_size = std::stoll(layout["batch_size"]);
  const int64_t limit = std::stoll(layout["test_examples"]);
  const auto task = train::load_lm_task(lm);
  const auto bands = train::frequency_bands(task->vocabulary().size());

  // How often the words of each band occur in the training verses the vocabulary came from.
  std::vector<int64_t> counts(static_cast<size_t>(task->vocabulary().size()), 0);
  for (const int32_t id : task->stream(train::kjv::Part::kTrain, 0))
    ++counts[static_cast<size_t>(id)];

  // The band of every id (the bands cover each id once).
  std::vector<size_t> band_of(static_cast<size_t>(task->vocabulary().size()));
  for (size_t b = 0; b < bands.size(); ++b) {
    for (int32_t id = bands[b].first_id; id <= bands[b].last_id; ++id) {
      band_of[static_cast<size_t>(id)] = b;
    }
  }

  std::vector<Evaluated> runs;
  for (size_t i = 0; i < files.size(); ++i) {
    train::LstmLanguageModel model(lm.vocabulary, lm.embedding, lm.hidden, 0.0, 0);
    train::load_model_parameters(files[i], model);
    const auto losses = train::token_losses(*task, model, part, limit, world, batch_size);
    Evaluated e;
    e.label = cmd.labels.empty() ? cmd.checkpoints[i] : cmd.labels[i];
    e.nll.assign(bands.size(), 0.0);
    e.tokens.assign(bands.size(), 0);
    for (size_t t = 0; t < losses.targets.size(); ++t) {
      const size_t b = band_of[static_cast<size_t>(losses.targets[t])];
      e.nll[b] += losses.nll[t];
      ++e.tokens[b];
      e.total_nll += losses.nll[t];
      ++e.total_tokens;
    }
    runs.push_back(std::move(e));
  }

  const char* part_name = train::kjv::to_string(part);
  std::printf("%s perplexity (%lld tokens, %d workers' layout):", part_name,
              static_cast<long long>(runs[0].total_tokens), world);
  for (const auto& r : runs) std::printf(" %s %.2f;", r.label.c_str(), r.perplexity());
  std::printf(
      "\n\n| words (by frequency in training) | occurrences per word in the training split | %s "
      "tokens |",
      part_name);
  for (const auto& r : runs) std::printf(" %s: perplexity in band |", r.label.c_str());
  for (size_t i = 1; i < runs.size(); ++i) {
    std::printf(" %s - %s: loss per token | share of the gap |", runs[i].label.c_str(),
                runs[0].label.c_str());
  }
  std::printf("\n|---|---:|---:|");
  for (size_t i = 0; i < runs.size() + 2 * (runs.size() - 1); ++i) std::printf("---:|");
  std::printf("\n");
  for (size_t b = 0; b < bands.size(); ++b) {
    int64_t low = -1, high = 0;
    for (int32_t id = bands[b].first_id; id <= bands[b].last_id; ++id) {
      const int64_t c = counts[static_cast<size_t>(id)];
      low = low < 0 ? c : std::min(low, c);
      high = std::max(high, c);
    }
    const std::string occurrences =
        low == high ? std::to_string(low) : detail::concat(low, "-", high);
    const int64_t n = runs[0].tokens[b];
    std::printf("| %s | %s | %lld (%.1f%%) |", bands[b].name.c_str(), occurrences.c_str(),
                static_cast<long long>(n),
                100.0 * static_cast<double>(n) / static_cast<double>(runs[0].total_tokens));
    for (const auto& r : runs) {
      if (n == 0) {
        std::printf(" - |");
      } else {
        std::printf(" %.2f |", std::exp(r.nll[b] / static_cast<double>(n)));
      }
    }
    for (size_t i = 1; i < runs.size(); ++i) {
      const double gap = runs[i].total_nll - runs[0].total_nll;
      const double diff = runs[i].nll[b] - runs[0].nll[b];
      std::printf(" %+.4f | %.1f%% |", n == 0 ? 0.0 : diff / static_cast<double>(n),
                  gap == 0.0 ? 0.0 : 100.0 * diff / gap);
    }
    std::printf("\n");
  }
}

}  // namespace

void add_lm_words(CLI::App& app) {
  auto cmd = std::make_shared<LmWordsCommand>();
  CLI::App* sub = app.add_subcommand(
      "lm-words",
      "Loss of lm checkpoints by word frequency: where DGC and dense differ (one table, markdown)");
  sub->add_option("checkpoints", cmd->checkpoints,
                  "checkpoint files of `dgc train --task lm --checkpoint PREFIX` "
                  "(PREFIX.step<S>.rank<r>; any rank), the first the baseline")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--label", cmd->labels, "a name per checkpoint, in order (default: the paths)");
  sub->add_option("--part", cmd->part, "the verses to evaluate")
      ->check(CLI::IsMember({"test", "validation"}))
      ->capture_default_str();
  sub->add_option("--cache-dir", cmd->cache_dir,
                  "where the prepared KJV corpus lives (default: as dgc train, "
                  "$XDG_CACHE_HOME/dgc or ~/.cache/dgc)");
  sub->callback([cmd] { run(*cmd); });
}

}  // namespace dgc::cli
