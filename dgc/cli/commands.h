// Subcommands of the `dgc` program. Each adds itself to the parent and runs from its callback.
// Errors are thrown as dgc::Error and reported by main().
#pragma once

#include <CLI/CLI.hpp>

namespace dgc::cli {

// dgc bench compress: one DGC step on random data vs its bandwidth bound and exact top-k.
void add_bench_compress(CLI::App& bench);
// dgc bench exchange: DGC exchange vs dense allreduce of the same gradient.
void add_bench_exchange(CLI::App& bench);
// dgc bench step: complete SGD steps of well-known models' shapes, dense vs DGC.
void add_bench_step(CLI::App& bench);
// dgc bench auth: cost per step of the job secret's HMAC tags (needs libtorch's model shapes).
void add_bench_auth(CLI::App& bench);
// dgc train: data-parallel training with or without DGC.
void add_train(CLI::App& app);
// dgc lm-words: the loss of lm checkpoints by word frequency.
void add_lm_words(CLI::App& app);
// dgc plan: predicted dense and DGC step times for a model, nodes and link (dgc/sim/cost_model.h).
void add_plan(CLI::App& app);
// dgc plot: PNG and SVG charts (gnuplot) from training metrics and benchmark JSON lines.
void add_plot(CLI::App& app);

}  // namespace dgc::cli
