// dgc plan: for a model, a node count, a link and a compute time per step, the predicted dense
// and DGC step times, the speedups, the best exchange algorithm and a plain verdict, from the
// cost model of dgc/sim/cost_model.h (constants fitted to the simulated cluster).
//   dgc plan --model resnet50 --nodes 64 --platform ethernet-1g
//   dgc plan --model cnn --nodes 4 --link mobile --compute-seconds 0.1   (dgc train's --link)
//   dgc plan --shapes FILE --nodes 16 --rate-gbit 10 --latency-ms 0.02 --compute-seconds 0.1
//   dgc plan --checkpoint runs/a/ckpt --nodes 64 --platform ethernet-1g --compute-seconds 0.2
// --fit FILE...: refits the constants from dgc-sim's JSON lines (bench/sim_scaling.sh --out) and
// reports, for every simulated step, the model's error, and for every (model, platform, nodes)
// with dense and all three exchanges simulated, whether the model picks the fastest. --check
// FILE...: the same report with the model's own constants.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/commands.h"
#include "dgc/cli/statistics.h"
#include "dgc/core/error.h"
#include "dgc/sim/compute.h"
#include "dgc/sim/cost_model.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/exchange_choice.h"

namespace dgc::cli {
namespace {

struct PlanOptions {
  std::string model = "resnet50";
  std::string shapes_file;
  std::string checkpoint;
  int nodes = 16;
  std::string platform;
  std::string link;  // as dgc train's --link: a platform or RATE_MBIT[:LATENCY_MS]
  double rate_gbit = 0.0;
  double latency_ms = -1.0;
  double compute_seconds = -1.0;
  double density = 0.001;
  std::vector<std::string> fit_files, check_files;
  bool json = false;
};

// A shapes file: one tensor per line, "name dim dim ...", '#' starts a comment.
std::vector<train::NamedShape> read_shapes(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot read the shapes file " + path);
  std::vector<train::NamedShape> shapes;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string name;
    if (!(fields >> name)) continue;
    std::vector<int64_t> shape;
    int64_t d = 0;
    while (fields >> d) {
      if (d <= 0) break;
      shape.push_back(d);
    }
    if (shape.empty() || !fields.eof()) {
      throw InvalidArgument(detail::concat(path, ":", number, ": expected 'name dim dim ...' ",
                                           "with positive dimensions, got '", line, "'"));
    }
    shapes.push_back({name, shape});
  }
  if (shapes.empty()) throw InvalidArgument("no tensors in the shapes file " + path);
  return shapes;
}

// The parameters of a `dgc train` checkpoint (its model/param/ records, in name order): `path` is
// one rank's file, or the --checkpoint prefix of a run, whose newest rank-0 file is read. Sets
// `file` to the file read.
std::vector<train::NamedShape> checkpoint_shapes(const std::string& path, std::string& file) {
  file = path;
  if (!std::filesystem::is_regular_file(path)) {
    const auto steps = train::checkpoint_steps(path, 0);
    if (steps.empty()) {
      throw InvalidArgument(detail::concat("no checkpoint at ", path,
                                           ": give a checkpoint file (PREFIX.stepS.rankR) or the ",
                                           "--checkpoint prefix of a dgc train run"));
    }
    file = train::checkpoint_path(path, steps.back(), 0);
  }
  const train::CheckpointFile checkpoint = train::CheckpointFile::read(file);
  const std::string prefix = "model/param/";
  std::vector<train::NamedShape> shapes;
  for (const auto& [name, record] : checkpoint.records()) {
    if (name.rfind(prefix, 0) == 0) shapes.push_back({name.substr(prefix.size()), record.shape});
  }
  if (shapes.empty()) {
    throw DataError(file +
                    " holds no model parameters (no model/param/ records): give a "
                    "checkpoint that dgc train wrote");
  }
  return shapes;
}

void print_plan(const PlanOptions& o) {
  std::string name = o.model;
  std::vector<train::NamedShape> shapes;
  if (!o.checkpoint.empty()) {
    shapes = checkpoint_shapes(o.checkpoint, name);
  } else if (!o.shapes_file.empty()) {
    shapes = read_shapes(o.shapes_file);
    name = o.shapes_file;
  } else {
    shapes = train::model_shapes(o.model);
  }
  const bool replay_model = o.checkpoint.empty() && o.shapes_file.empty();
  sim::Link link;
  std::string link_name;
  if (!o.link.empty()) {
    link = train::parse_link(o.link);
    link_name = o.link;
  } else if (!o.platform.empty()) {
    link = sim::platform_link(o.platform);
    link_name = o.platform;
  } else {
    if (!(o.rate_gbit > 0) || o.latency_ms < 0) {
      throw InvalidArgument(
          "give the link as --link (a platform such as mobile, or RATE_MBIT[:LATENCY_MS] as "
          "dgc train takes it), --platform NAME, or --rate-gbit R and --latency-ms L (one way, "
          "host to host)");
    }
    link = {o.rate_gbit * 1e9, o.latency_ms / 1e3};
    link_name = sim::rate_text(link.bits_per_second);
  }
  double compute = o.compute_seconds;
  if (compute < 0) {
    const auto& defaults = sim::default_compute_seconds();
    const auto it = replay_model ? defaults.find(o.model) : defaults.end();
    if (it == defaults.end()) {
      throw InvalidArgument("no default compute time for " + name + ": give --compute-seconds");
    }
    compute = it->second;
  }
  const sim::ModelSize size = sim::model_size(shapes, o.density);
  const sim::Prediction p = sim::predict(size, o.nodes, link, compute);
  const char* best = to_string(p.best);
  // At this latency dgc train pipelines (--pipeline 1 by default with --link): the exchange runs
  // while the next step computes, and compute, compression and update stay on the step's path.
  const bool pipelined = train::pipelined_by_default(link);
  const double exchange =
      sim::exchange_seconds(size, o.nodes, link, p.best, sim::fitted_constants());
  const double pipelined_step = std::max(p.best_dgc() - exchange, exchange);
  if (o.json) {
    nlohmann::json j = {{"model", name},
                        {"parameters", size.parameters},
                        {"nodes", o.nodes},
                        {"link", link_name},
                        {"compute_seconds", compute},
                        {"dense_step_s", p.dense},
                        {"best_exchange", best},
                        {"dgc_step_s", p.best_dgc()},
                        {"dense_speedup", p.dense_speedup(o.nodes)},
                        {"dgc_speedup", p.dgc_speedup(o.nodes)},
                        {"compress", p.compress()}};
    if (pipelined) j["dgc_pipelined_step_s"] = pipelined_step;
    for (size_t i = 0; i < sim::kPlannedAlgorithms.size(); ++i) {
      j[std::string("dgc_step_s_") + to_string(sim::kPlannedAlgorithms[i])] = p.dgc[i];
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "model %s: %lld parameters (%lld compressed, %lld on the dense path), %lld "
      "selected per step at density %g\n",
      name.c_str(), static_cast<long long>(size.parameters),
      static_cast<long long>(size.compressed), static_cast<long long>(size.dense_path),
      static_cast<long long>(size.selected), o.density);
  std::printf("%d nodes, link %s (%s, %.3g ms one way), compute %.3f s per step\n", o.nodes,
              link_name.c_str(), sim::rate_text(link.bits_per_second).c_str(),
              link.latency_seconds * 1e3, compute);
  std::printf("predicted step: dense %.3f s (speedup %.1fx over one node)\n", p.dense,
              p.dense_speedup(o.nodes));
  for (size_t i = 0; i < sim::kPlannedAlgorithms.size(); ++i) {
    std::printf("                DGC %-16s %.3f s\n", to_string(sim::kPlannedAlgorithms[i]),
                p.dgc[i]);
  }
  std::printf(
      "best exchange: %s, %.3f s per step (speedup %.1fx over one node, efficiency "
      "%.2f)\n",
      best, p.best_dgc(), p.dgc_speedup(o.nodes), p.dgc_speedup(o.nodes) / o.nodes);
  if (p.compress()) {
    std::printf("verdict: compress (DGC with --exchange %s is %.2fx faster than dense)\n", best,
                p.dense / p.best_dgc());
  } else {
    std::printf("verdict: do not compress (dense is %.2fx faster than the best DGC exchange)\n",
                p.best_dgc() / p.dense);
  }
  if (pipelined) {
    std::printf(
        "pipelined: at %.3g ms one way dgc train pipelines (--pipeline 1, its default with "
        "--link): about %.3f s per step with %s, the larger of the exchange (%.3f s) and the "
        "rest, which overlap\n",
        link.latency_seconds * 1e3, pipelined_step, best, exchange);
  }
}

}  // namespace

// plan_fit.cc: the report over dgc-sim's JSON lines, with the constants refitted to them or not.
void run_plan_fit(const std::vector<std::string>& paths, bool refit);

void add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predicted dense and DGC step times, best exchange and whether to compress");
  cmd->add_option("--model", o->model, "replay model (resnet50, alexnet, vgg16, lstm-ptb, cnn)")
      ->capture_default_str();
  auto* shapes = cmd->add_option("--shapes", o->shapes_file,
                                 "a shapes file instead: one tensor per line, 'name dim dim ...'");
  cmd->add_option("--checkpoint", o->checkpoint,
                  "or the model of a dgc train checkpoint: a rank's file, or the run's "
                  "--checkpoint prefix (its newest rank-0 file)")
      ->excludes(shapes);
  cmd->add_option("--nodes", o->nodes, "nodes (one rank each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  auto* link = cmd->add_option("--link", o->link,
                               "the link as dgc train's --link takes it: a platform of "
                               "bench/platforms (ethernet-1g, mobile, ...) or "
                               "RATE_MBIT[:LATENCY_MS] (one way, host to host; default 0.05 ms)");
  cmd->add_option("--platform", o->platform, "or a platform of bench/platforms (e.g. ethernet-1g)")
      ->excludes(link);
  cmd->add_option("--rate-gbit", o->rate_gbit, "or the link rate, Gbit/s")->excludes(link);
  cmd->add_option("--latency-ms", o->latency_ms, "and its one-way latency host to host, ms")
      ->excludes(link);
  cmd->add_option("--compute-seconds", o->compute_seconds,
                  "forward + backward time per step (default: the model's, dgc/sim/compute.h)");
  cmd->add_option("--density", o->density, "DGC density after warm-up")
      ->capture_default_str()
      ->check(CLI::Range(1e-9, 1.0));
  auto* fit = cmd->add_option("--fit", o->fit_files,
                              "refit the cost model to dgc-sim JSON lines (one file or more) and "
                              "report how well it fits");
  cmd->add_option("--check", o->check_files,
                  "report how well the model's own constants predict dgc-sim JSON lines (one "
                  "file or more), without refitting")
      ->excludes(fit);
  cmd->add_flag("--json", o->json, "one JSON line instead of text");
  cmd->callback([o] {
    if (!o->fit_files.empty()) {
      run_plan_fit(o->fit_files, /*refit=*/true);
    } else if (!o->check_files.empty()) {
      run_plan_fit(o->check_files, /*refit=*/false);
    } else {
      print_plan(*o);
    }
  });
}

}  // namespace dgc::cli
