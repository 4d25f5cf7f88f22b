// The dgc program: one binary, subcommands (`dgc --help` lists them).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "dgc/cli/commands.h"
#include "dgc/core/error.h"
#if DGC_WITH_TORCH
#include "dgc/comm/c10d_store.h"
#endif

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
  dgc::cli::add_plot(app);
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
