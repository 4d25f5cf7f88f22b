// dgc plan --fit FILE...: the cost model's constants fitted to dgc-sim's JSON lines, and how well
// the model with them reproduces every simulated step (see plan.cc and dgc/sim/cost_model.h).
// dgc plan --check FILE...: the same report with the model's own constants, not refitted (how
// well they predict runs they were not fitted to).
//
// Constants: medians over the runs of the per-element figures the simulator measured:
//   allreduce_factor        exchange_s / the ring allreduce's time    (dense runs, nodes >= 2)
//   compress_per_element    compress_s / Pc                      (DGC runs, nodes >= 2)
//   update_per_element      update_s / P                          (every run, nodes >= 2)
//   bytes_per_element       (message_bytes - 4 Pd - header) / k   (DGC runs)
//   decode_per_element      (exchange_s - the model's wire time) / ((N-1) k)
//                                                                 (allgather, direct; N >= 4)
//   sparse_volume           (wire_received - the dense path's) / M (sparse-allreduce; N >= 4)
//   sparse_cpu_per_element  (exchange_s - the model's wire time) / (k log2 N)
//                                                                 (sparse-allreduce; N >= 4)
// (The exchange's CPU is taken from the simulated exchange time, not from the exchange's own
// timings, exchange_cpu_s: those are wall-clock time on this machine, which its load inflates.)
// Then, per run, the predicted step (with the run's platform link and compute time) against the
// simulated one, and per (model, platform, nodes) with all four simulated, whether the
// predicted fastest of dense, allgather, direct and sparse-allreduce is the simulated fastest.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "dgc/cli/statistics.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/sim/cost_model.h"

namespace dgc::cli {
namespace {

struct Run {
  std::string model, platform, algorithm;
  int nodes = 0;
  double compute = 0, step = 0, compress = 0, update = 0, exchange = 0;
  double message_bytes = 0, wire_received = 0;
  sim::ModelSize size;
};

// One rank's compressed message: its message bytes less the dense-path values and the header.
double message_bytes(const Run& r) {
  return r.message_bytes - 4.0 * double(r.size.dense_path) - double(kMessageHeaderBytes);
}

std::vector<Run> read_runs(const std::vector<std::string>& paths) {
  std::vector<Run> runs;
  std::map<std::string, sim::ModelSize> sizes;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    if (!in) {
      throw InvalidArgument("cannot read " + path +
                            ": give files of dgc-sim's JSON lines (bench/sim_scaling.sh writes "
                            "them; docs/data/sim-*.jsonl are the committed ones)");
    }
    const size_t before = runs.size();
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("step_s") || !j.contains("algorithm")) continue;
      Run r;
      r.model = j.at("model");
      r.platform = j.at("platform");
      r.algorithm = j.at("algorithm");
      r.nodes = j.at("nodes");
      r.compute = j.at("compute_seconds");
      r.step = j.at("step_s");
      r.compress = j.at("compress_s");
      r.update = j.at("update_s");
      r.exchange = j.at("exchange_s");
      r.message_bytes = j.at("message_bytes");
      r.wire_received = j.at("wire_received");
      const double density = j.at("density");
      if (!sizes.count(r.model))
        sizes[r.model] = sim::model_size(train::model_shapes(r.model), density);
      r.size = sizes[r.model];
      runs.push_back(r);
    }
    if (runs.size() == before) throw InvalidArgument("no dgc-sim result lines in " + path);
  }
  return runs;
}

sim::CostConstants fit(const std::vector<Run>& runs) {
  std::vector<double> factor, compress, update, bytes, decode, volume, sparse_cpu;
  // First the byte and volume constants, then the CPU left over by the wire time they give.
  const sim::CostConstants unit;
  for (const Run& r : runs) {
    if (r.nodes < 2) continue;
    update.push_back(r.update / double(r.size.parameters));
    if (r.algorithm == "dense") {
      const auto link = sim::platform_link(r.platform);
      factor.push_back(r.exchange /
                       sim::dense_allreduce_seconds(r.size.parameters, r.nodes, link, unit));
      continue;
    }
    compress.push_back(r.compress / double(r.size.compressed));
    bytes.push_back(message_bytes(r) / double(r.size.selected));
    if (r.nodes >= 4 && r.algorithm == "sparse-allreduce") {
      const double n = r.nodes;
      const double dense_path = 2.0 * (n - 1.0) / n * 4.0 * double(r.size.dense_path);
      volume.push_back((r.wire_received - dense_path) / message_bytes(r));
    }
  }
  DGC_CHECK(!compress.empty() && !volume.empty() && !factor.empty(),
            "--fit needs DGC runs of every exchange algorithm at 4 nodes or more");
  sim::CostConstants c{.allreduce_factor = median(factor),
                       .compress_per_element = median(compress),
                       .update_per_element = median(update),
                       .bytes_per_element = median(bytes),
                       .decode_per_element = 0.0,
                       .sparse_volume = median(volume),
                       .sparse_cpu_per_element = 0.0};
  for (const Run& r : runs) {
    if (r.nodes < 4 || r.algorithm == "dense") continue;
    const ExchangeAlgorithm a = parse_exchange_algorithm(r.algorithm);
    const double wire =
        sim::exchange_seconds(r.size, r.nodes, sim::platform_link(r.platform), a, c);
    const double cpu = std::max(0.0, r.exchange - wire);
    const double k = double(r.size.selected), n = r.nodes;
    if (a == ExchangeAlgorithm::kSparseAllreduce) {
      sparse_cpu.push_back(cpu / (k * std::log2(n)));
    } else {
      decode.push_back(cpu / ((n - 1.0) * k));
    }
  }
  DGC_CHECK(!decode.empty(), "--fit needs allgather or direct runs at 4 nodes or more");
  c.decode_per_element = median(decode);
  c.sparse_cpu_per_element = median(sparse_cpu);
  return c;
}

double predicted_step(const Run& r, const sim::CostConstants& c) {
  const sim::Prediction p =
      sim::predict(r.size, r.nodes, sim::platform_link(r.platform), r.compute, c);
  if (r.algorithm == "dense") return p.dense;
  const ExchangeAlgorithm a = parse_exchange_algorithm(r.algorithm);
  for (size_t i = 0; i < sim::kPlannedAlgorithms.size(); ++i) {
    if (sim::kPlannedAlgorithms[i] == a) return p.dgc[i];
  }
  throw InvalidArgument("unknown algorithm " + r.algorithm);
}

}  // namespace

void run_plan_fit(const std::vector<std::string>& paths, bool refit) {
  const std::vector<Run> runs = read_runs(paths);
  const sim::CostConstants c = refit ? fit(runs) : sim::fitted_constants();
  if (refit) {
    std::printf("fitted constants (%zu runs):\n", runs.size());
  } else {
    std::printf("the model's constants (dgc/sim/cost_model.cc), not refitted; %zu runs:\n",
                runs.size());
  }
  std::printf("  allreduce_factor       = %.4g\n", c.allreduce_factor);
  std::printf("  compress_per_element   = %.4g s\n  update_per_element     = %.4g s\n",
              c.compress_per_element, c.update_per_element);
  std::printf("  bytes_per_element      = %.4g\n  decode_per_element     = %.4g s\n",
              c.bytes_per_element, c.decode_per_element);
  std::printf("  sparse_volume          = %.4g messages\n  sparse_cpu_per_element = %.4g s\n",
              c.sparse_volume, c.sparse_cpu_per_element);
  std::printf("\n%-9s %-14s %5s %-17s %10s %10s %7s\n", "model", "platform", "nodes", "algorithm",
              "sim s", "model s", "error");
  std::vector<double> errors;
  // (model, platform, nodes) -> algorithm -> (simulated, predicted)
  std::map<std::tuple<std::string, std::string, int>,
           std::map<std::string, std::pair<double, double>>>
      groups;
  for (const Run& r : runs) {
    const double predicted = predicted_step(r, c);
    const double error = predicted / r.step - 1.0;
    errors.push_back(std::fabs(error));
    groups[{r.model, r.platform, r.nodes}][r.algorithm] = {r.step, predicted};
    std::printf("%-9s %-14s %5d %-17s %10.4f %10.4f %+6.1f%%\n", r.model.c_str(),
                r.platform.c_str(), r.nodes, r.algorithm.c_str(), r.step, predicted, 100.0 * error);
  }
  std::printf("\n|error|: median %.1f%%, max %.1f%% over %zu runs\n", 100.0 * median(errors),
              100.0 * *std::max_element(errors.begin(), errors.end()), errors.size());
  // A near tie is not a wrong choice for a user: also counted, separately, is a predicted choice
  // whose simulated step is within 2% of the fastest.
  int cases = 0, agree = 0, near = 0;
  std::printf("\nfastest, simulated vs predicted (dense and the three exchanges simulated):\n");
  for (const auto& [key, algorithms] : groups) {
    if (algorithms.size() < 4 || std::get<2>(key) < 2) continue;
    std::string sim_best, model_best;
    double sim_time = 1e300, model_time = 1e300;
    for (const auto& [a, t] : algorithms) {
      if (t.first < sim_time) sim_time = t.first, sim_best = a;
      if (t.second < model_time) model_time = t.second, model_best = a;
    }
    ++cases;
    agree += sim_best == model_best;
    near += algorithms.at(model_best).first <= 1.02 * sim_time;
    std::printf("  %-9s %-14s %4d  simulated %-16s predicted %-16s%s\n", std::get<0>(key).c_str(),
                std::get<1>(key).c_str(), std::get<2>(key), sim_best.c_str(), model_best.c_str(),
                sim_best == model_best ? "" : "  (differs)");
  }
  std::printf("agreement: %d of %d; the predicted choice within 2%% of the fastest: %d of %d\n",
              agree, cases, near, cases);
  // Crossovers of the model with these constants: the link rate above which dense is faster
  // than the best DGC exchange (20 us one way, each model's compute time of the runs), and the
  // node count from which sparse-allreduce is the fastest exchange at 1 Gbit/s.
  std::map<std::string, const Run*> models;
  for (const Run& r : runs) models[r.model] = &r;
  std::printf(
      "\ncrossovers (the model): rate above which dense is faster; sparse-allreduce "
      "fastest from N nodes at 1 Gbit/s\n");
  for (const auto& [name, r] : models) {
    std::printf("  %-9s", name.c_str());
    for (int nodes : {4, 16, 64, 256}) {
      double low = 0.01e9, high = 1e13;  // bits/s: DGC faster at low, dense at high
      const auto dense_wins = [&](double rate) {
        return !sim::predict(r->size, nodes, {rate, 20e-6}, r->compute, c).compress();
      };
      if (dense_wins(low) || !dense_wins(high)) {
        std::printf("  N=%d: none", nodes);
        continue;
      }
      for (int i = 0; i < 60; ++i) {
        const double mid = std::sqrt(low * high);
        (dense_wins(mid) ? high : low) = mid;
      }
      std::printf("  N=%d: %.3g Gbit/s", nodes, high / 1e9);
    }
    int from = 0;
    for (int nodes = 2; nodes <= 1024 && from == 0; ++nodes) {
      const auto p = sim::predict(r->size, nodes, sim::platform_link("ethernet-1g"), r->compute, c);
      if (p.best == ExchangeAlgorithm::kSparseAllreduce) from = nodes;
    }
    std::printf("  sparse-allreduce from N=%d\n", from);
  }
}

}  // namespace dgc::cli
