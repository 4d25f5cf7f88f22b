// The dgc program: one binary, subcommands (`dgc --help` lists them).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dgc/cli/commands.h"
#include "dgc/core/error.h"
#if DGC_WITH_TORCH
#include "dgc/comm/c10d_store.h"
#endif

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// CLI11 answers a misspelt command ("dgc trian") with "A subcommand is required". Walks the
// command words before the first option; at the first one that is not a command where one is
// expected, says so, names the closest command when one is near, and returns false.
bool commands_known(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  std::string path = "dgc";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto commands = at->get_subcommands([](const CLI::App*) { return true; });
    if (word.empty() || word[0] == '-' || commands.empty()) return true;
    const CLI::App* next = nullptr;
    const CLI::App* closest = nullptr;
    size_t best = word.size();
    for (const CLI::App* c : commands) {
      if (c->get_name() == word) next = c;
      const size_t d = edit_distance(word, c->get_name());
      if (d < best) best = d, closest = c;
    }
    if (next == nullptr) {
      std::fprintf(stderr, "dgc: '%s' is not a command of %s", word.c_str(), path.c_str());
      if (closest != nullptr && best <= std::max<size_t>(2, word.size() / 3)) {
        std::fprintf(stderr, "; did you mean '%s %s'?", path.c_str(), closest->get_name().c_str());
      }
      std::fprintf(stderr, " (%s --help lists them)\n", path.c_str());
      return false;
    }
    at = next;
    path += " " + word;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dgc: data-parallel training with Deep Gradient Compression (Lin et al., ICLR 2018)"};
  app.set_version_flag("--version", DGC_VERSION);
  app.require_subcommand(1);
#if DGC_WITH_TORCH
  // The TCP rendezvous meets in libtorch's store, so that ranks can join torchrun's agent store.
  dgc::comm::use_c10d_store();
  dgc::cli::add_train(app);
  dgc::cli::add_lm_words(app);
#endif
#if DGC_BUILD_BENCHMARKS
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks; each runs its baselines in the same process");
  bench->require_subcommand(1);
  dgc::cli::add_bench_compress(*bench);
#if DGC_WITH_COMM
  dgc::cli::add_bench_exchange(*bench);
#endif
#if DGC_WITH_TORCH
  dgc::cli::add_bench_step(*bench);
  dgc::cli::add_bench_auth(*bench);
#endif
#endif
#if DGC_WITH_COMM
  dgc::cli::add_plan(app);
#endif
  dgc::cli::add_plot(app);
  if (!commands_known(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dgc::Error& e) {
    std::fprintf(stderr, "dgc: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dgc: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
