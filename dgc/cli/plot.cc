// dgc plot: charts (PNG and SVG, drawn by gnuplot) from the JSON lines that dgc writes.
//
// Inputs are recognised by their fields, line by line:
//   - training metrics (`dgc train --metrics FILE`): one object per epoch with "epoch" and
//     "seconds". One series per file. Charts:
//       NAME-METRIC-epoch  the metric against the epoch;
//       NAME-METRIC-time   the metric against wall time (the running sum of "seconds");
//       NAME-bytes         message bytes per worker in each epoch ("message_bytes"; in files
//                          written before that name, "bytes_sent"), log scale.
//     METRIC is --metric, or the first of test_accuracy (drawn in %), test_perplexity,
//     validation_perplexity and test_token_error_rate (drawn in %) that every file has.
//     --target V draws a dashed horizontal line at V (in the metric's own units, so 0.9125 for
//     91.25% accuracy) on the two metric charts, titled --target-label.
//   - exchange benchmarks (`dgc bench exchange --json`, and `bench/slow_network.sh --out`, which
//     adds "profile" and "rate"): objects with "benchmark": "exchange". One series per link
//     profile (else rate; "loopback" without either) and exchange algorithm (when the object
//     names one). Charts:
//       NAME-exchange-time     DGC exchange and dense allreduce time against workers, log scale;
//       NAME-exchange-speedup  dense time / DGC time against workers.
//   - replayed steps (`dgc bench step --json`, and `bench/slow_network.sh --bench step --out`):
//     objects with "benchmark": "step". One series per link profile (else "link") and model.
//     Charts:
//       NAME-step-time     dense and DGC time per step (compute included) against workers;
//       NAME-step-speedup  dense step time / DGC step time against workers.
//     Of several objects for the same series and worker count, the last one is drawn.
// Beside the charts NAME.gp holds the gnuplot script with the data inline, so a chart can be
// restyled and redrawn with `gnuplot NAME.gp`.
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dgc/cli/commands.h"
#include "dgc/cli/plot_charts.h"
#include "dgc/core/error.h"

extern char** environ;

namespace dgc::cli {
namespace {

namespace fs = std::filesystem;

using namespace plot;

// The whole gnuplot script: every chart in PNG and SVG.
std::string script(const PlotCommand& cmd, const std::vector<Chart>& charts) {
  std::ostringstream out;
  out << "# Written by dgc plot; redraw with: gnuplot " << cmd.name << ".gp\n";
  for (const auto& chart : charts) {
    for (const char* format : {"png", "svg"}) {
      const std::string file = (fs::path(cmd.out) / (chart.file + "." + format)).string();
      out << "reset\n";
      if (std::strcmp(format, "png") == 0) {
        out << "set terminal pngcairo size " << cmd.width << "," << cmd.height
            << " font 'sans,11' noenhanced\n";
      } else {
        out << "set terminal svg size " << cmd.width << "," << cmd.height
            << " font 'sans,11' noenhanced background '#ffffff'\n";
      }
      out << "set output " << quote(file) << "\nset grid\nset border lw 1.2\n"
          << chart.commands << "unset output\n";
    }
  }
  return out.str();
}

// Runs `gnuplot SCRIPT`; its messages go to our stderr.
void run_gnuplot(const std::string& script_path) {
  const std::string program = "gnuplot";
  std::vector<char*> argv = {const_cast<char*>(program.c_str()),
                             const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc == ENOENT) {
    throw DataError(
        "gnuplot not found: install it (Debian: apt-get install gnuplot-nox), then run again");
  }
  if (rc != 0) throw Error(std::string("cannot start gnuplot: ") + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error(std::string("waiting for gnuplot: ") + std::strerror(errno));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error("gnuplot failed on " + script_path + " (its messages are above)");
  }
}

void run(const PlotCommand& cmd) {
  const auto charts = read_charts(cmd);
  std::error_code ec;
  fs::create_directories(cmd.out, ec);
  if (ec) throw DataError("cannot create --out directory '" + cmd.out + "': " + ec.message());
  const std::string script_path = (fs::path(cmd.out) / (cmd.name + ".gp")).string();
  {
    std::ofstream file(script_path, std::ios::trunc);
    file << script(cmd, charts);
    if (!file.flush()) throw DataError("cannot write " + script_path);
  }
  run_gnuplot(script_path);
  for (const auto& chart : charts) {
    for (const char* format : {"png", "svg"}) {
      const fs::path file = fs::path(cmd.out) / (chart.file + "." + format);
      if (!fs::exists(file) || fs::file_size(file) == 0) {
        throw Error("gnuplot did not write " + file.string());
      }
      std::printf("wrote %s\n", file.c_str());
    }
  }
}

}  // namespace

void add_plot(CLI::App& app) {
  auto cmd = std::make_shared<PlotCommand>();
  CLI::App* sub = app.add_subcommand(
      "plot",
      "Draw PNG and SVG charts with gnuplot from JSON lines: training metrics (dgc train "
      "--metrics: the test metric by epoch and by wall time, message bytes per epoch; one line per "
      "file), exchange benchmarks (dgc bench exchange --json, bench/slow_network.sh --out: "
      "time and speedup by workers) and replayed steps (dgc bench step --json: step time and "
      "speedup by workers)");
  sub->add_option("files", cmd->files, "JSON lines files")->required()->check(CLI::ExistingFile);
  sub->add_option("--label", cmd->labels,
                  "Legend label of each file, in order (default: dense/DGC from the runs' "
                  "compression, else the file names); repeat once per file: --label A --label B")
      ->allow_extra_args(false);
  sub->add_option("--out", cmd->out, "Directory for the charts and the gnuplot script")
      ->capture_default_str();
  sub->add_option("--name", cmd->name, "Prefix of the chart files")->capture_default_str();
  sub->add_option("--metric", cmd->metric,
                  "Training metric to draw (default: test_accuracy, else test_perplexity, else "
                  "validation_perplexity, else test_token_error_rate)");
  sub->add_option("--title", cmd->title, "Text put before every chart title");
  sub->add_option("--target", cmd->target,
                  "Draw a dashed line at this level of the training metric, in its own units "
                  "(test_accuracy as a fraction: 0.9125 for 91.25%)");
  sub->add_option("--target-label", cmd->target_label, "Legend label of the --target line")
      ->capture_default_str();
  sub->add_option("--width", cmd->width, "Chart width, pixels")
      ->check(CLI::Range(200, 4000))
      ->capture_default_str();
  sub->add_option("--height", cmd->height, "Chart height, pixels")
      ->check(CLI::Range(150, 4000))
      ->capture_default_str();
  sub->callback([cmd] { run(*cmd); });
}

}  // namespace dgc::cli
