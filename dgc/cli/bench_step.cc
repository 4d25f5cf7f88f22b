// dgc bench step: complete data-parallel SGD steps of well-known models, dense and with DGC, in
// the same run, with the forward and backward passes replaced by a stated compute time.
//
// What runs, per model and rank: a module whose parameters have the model's real names and shapes
// (dgc/train/model_shapes.h), synthetic gradients (uniform in [-0.01, 0.01), a function of seed,
// rank and variant; `gradient variants` per rank, used in turn), and the real
// dgc::train::DistributedOptimizer::step(): reading and checking the gradients, the compressor
// (momentum correction, selection, masking) for every compressed tensor, the exchange (encode,
// collectives, decode) and the weight update; with --compression none for the dense baseline.
// Density d from the first step (no warm-up: these are steps of a run past its warm-up).
//
// Timing: before each step a barrier (untimed); every rank times its own step(); the step's time
// is the slowest rank's, the reported figure the median over `steps` timed steps (after
// `untimed_iterations` untimed ones). The time per training step is
//   step_seconds = compute_seconds + that median,
// where compute_seconds stands for the forward and backward pass on an accelerator (a setting;
// see kComputeSeconds for the defaults and their sources): the optimizer step runs after the
// backward pass, not overlapped with it, in this implementation as in the paper's.
// Scaling efficiency = N-rank throughput / (N x one-rank throughput) = step_1 / step_N, where
// step_1 is measured in this process on a world of one (compute + the local optimizer step,
// nothing on the wire) before the N-rank runs.
//
// The step's own work (compress + update: everything but the exchange, slowest rank, medians) is
// printed against two figures rank 0 measures in the same process on the same number of elements
// (bench_step_bounds.h), one pass after each step (after the timings are gathered, before the
// next barrier): DGC's against the core's fused step (Compressor::step on one tensor of all the
// elements), the dense optimizer's against its streaming bound (one pass of momentum SGD with
// weight decay over g, u and w).
//
// Launch: `--workers N` threads in this process over Gloo (default 4); one rank per process under
// mpirun or with torchrun variables (bench/slow_network.sh --bench step). Rank 0 prints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/bench_step_bounds.h"
#include "dgc/cli/commands.h"
#include "dgc/cli/statistics.h"
#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/train/model_shapes.h"
#include "dgc/train/optimizer.h"

namespace dgc::cli {
namespace {

// Default compute time per step (forward + backward on one accelerator), seconds. Sources:
//   resnet50, vgg16, alexnet: the training throughput (images/s, batch 30, SGD) of the MXNet
//   fine-tuning benchmark on a Maxwell GeForce GTX TITAN X (knjcode/mxnet-finetuner,
//   docs/benchmark.md): ResNet-50 109.98, VGG-16 59.80, CaffeNet (AlexNet's one-GPU variant)
//   1019.24 images/s, i.e. 0.273 s, 0.502 s and 0.029 s for 30 images;
//   lstm-ptb and cnn: no published figure at hand; 0.1 s is an assumption, flagged as a default
//   in the output (pass --compute-seconds).
// The reference figure for ResNet-50 is 0.1 s (pass --compute-seconds 0.1).
const std::map<std::string, double>& default_compute_seconds() {
  static const std::map<std::string, double> seconds = {
      {"resnet50", 30.0 / 109.98},
      {"vgg16", 30.0 / 59.80},
      {"alexnet", 30.0 / 1019.24},
      {"lstm-ptb", 0.1},
      {"cnn", 0.1},
  };
  return seconds;
}

struct BenchStepOptions {
  std::vector<std::string> models = {"resnet50"};
  double compute_seconds = -1.0;  // < 0: the model's default
  int workers = 0;                // local threads (0: 4); under a launcher: must match if given
  int steps = 5;
  int untimed_iterations = 1;
  int variants = 2;
  double density = 0.001;
  std::string link = "loopback";  // label for the output
  double bandwidth_gbit = 0.0;    // > 0: report the wire time at this rate
  std::string hostname;
  double timeout_seconds = 300.0;
  uint64_t seed = 1;
  bool skip_single = false;  // skip the one-rank baseline (scaling efficiency not reported)
  bool json = false;
};

// A module that only holds parameters of the given names and shapes.
struct ShapeModule : torch::nn::Module {
  explicit ShapeModule(const std::vector<train::NamedShape>& shapes, uint64_t seed) {
    torch::NoGradGuard no_grad;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
    for (const auto& [name, shape] : shapes) {
      torch::Tensor t = torch::empty(shape, torch::kFloat32);
      float* p = t.data_ptr<float>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = uniform(rng);
      std::string key = name;
      std::replace(key.begin(), key.end(), '.', '_');  // module parameter names may not have '.'
      params.push_back(register_parameter(key, t));
    }
  }
  std::vector<torch::Tensor> params;
};

struct Measured {
  double step = 0.0;      // median of the slowest rank's optimizer step
  double compress = 0.0;  // medians of the slowest rank's parts
  double exchange = 0.0;
  double update = 0.0;
  // Rank 0: the median of its bound (StepBounds: the core's fused step for DGC, the streaming
  // bound for dense), one pass after each step.
  double bound = 0.0;
  // The last step's bytes on this rank (rank 0's in the output; the collectives are symmetric
  // across ranks).
  ExchangeBytes bytes;
};

// Runs the steps of one configuration on this rank (collective). The result is the same on every
// rank.
Measured measure(comm::Communicator& comm, const std::vector<train::NamedShape>& shapes,
                 train::Compression compression, const BenchStepOptions& o,
                 const std::string& model, StepBounds* bounds = nullptr) {
  ShapeModule module(shapes, o.seed);
  std::vector<std::vector<torch::Tensor>> variants(static_cast<size_t>(o.variants));
  for (int v = 0; v < o.variants; ++v) {
    std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(comm.rank()) * 7919u +
                        static_cast<uint64_t>(v));
    std::uniform_real_distribution<float> uniform(-0.01f, 0.01f);
    for (const auto& p : module.params) {
      torch::Tensor g = torch::empty_like(p);
      float* data = g.data_ptr<float>();
      for (int64_t i = 0; i < g.numel(); ++i) data[i] = uniform(rng);
      variants[static_cast<size_t>(v)].push_back(g);
    }
  }
  train::OptimizerOptions options;
  options.compression = compression;
  options.density = {.after_warmup = o.density, .warmup_epochs = 0.0, .iterations_per_stage = 0};
  options.lr = {.base = 0.1, .warmup_epochs = 0.0};
  options.lr.decay = LearningRateSchedule::Decay::kConstant;
  options.compressor.seed = o.seed;
  options.timeout = comm::Timeout{static_cast<int64_t>(o.timeout_seconds * 1000.0)};
  train::DistributedOptimizer optimizer(comm, module, options, "model=" + model);

  const int world = comm.size();
  std::vector<double> steps, compress, exchange, update, bound;
  Measured m;
  for (int s = 0; s < o.untimed_iterations + o.steps; ++s) {
    const auto& grads = variants[static_cast<size_t>(s % o.variants)];
    for (size_t i = 0; i < module.params.size(); ++i) module.params[i].mutable_grad() = grads[i];
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    optimizer.step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The slowest rank's times, outside the timing.
    const auto& t = optimizer.last_timings();
    const auto& b = optimizer.last_bytes();
    std::vector<float> all(static_cast<size_t>(4 * world), 0.0f);
    const size_t r = static_cast<size_t>(comm.rank());
    all[r] = static_cast<float>(seconds);
    all[world + r] = static_cast<float>(t.compress);
    all[2 * world + r] = static_cast<float>(t.exchange);
    all[3 * world + r] = static_cast<float>(t.update);
    comm.allreduce_sum(all);
    double bound_seconds = 0.0;
    if (bounds != nullptr) {
      bound_seconds =
          compression == train::Compression::kNone ? bounds->dense_bound(s) : bounds->core_step(s);
    }
    const auto column_max = [&](int c) {
      return *std::max_element(all.begin() + c * world, all.begin() + (c + 1) * world);
    };
    if (s < o.untimed_iterations) continue;
    steps.push_back(column_max(0));
    compress.push_back(column_max(1));
    exchange.push_back(column_max(2));
    update.push_back(column_max(3));
    bound.push_back(bound_seconds);
    m.bytes = b;
  }
  m.step = median(steps);
  m.compress = median(compress);
  m.exchange = median(exchange);
  m.update = median(update);
  m.bound = median(bound);
  return m;
}

struct Row {
  std::string model;
  int64_t parameters = 0;
  int workers = 0;
  double compute = 0.0;
  bool compute_default = false;
  Measured dense, dgc;
  std::optional<Measured> dense_single, dgc_single;
};

void print(const Row& r, const BenchStepOptions& o) {
  const double dense_step = r.compute + r.dense.step;
  const double dgc_step = r.compute + r.dgc.step;
  std::optional<double> eff_dense, eff_dgc;
  if (r.dense_single) eff_dense = (r.compute + r.dense_single->step) / dense_step;
  if (r.dgc_single) eff_dgc = (r.compute + r.dgc_single->step) / dgc_step;
  // The optimizer step's own work (everything but the exchange), slowest rank, medians.
  const double dgc_own = r.dgc.compress + r.dgc.update;
  const double dense_own = r.dense.compress + r.dense.update;
  const double gbit = o.bandwidth_gbit;
  const auto wire = [&](const Measured& m) {
    return gbit > 0
               ? 8.0 * static_cast<double>(std::max(m.bytes.wire_sent, m.bytes.wire_received)) /
                     (gbit * 1e9)
               : 0.0;
  };
  if (o.json) {
    const auto optional = [](const std::optional<double>& v) {
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
    };
    nlohmann::ordered_json j = {
        {"benchmark", "step"},
        {"model", r.model},
        {"parameters", r.parameters},
        {"workers", r.workers},
        {"link", o.link},
        {"density", o.density},
        {"compute_seconds", r.compute},
        {"compute_seconds_default", r.compute_default},
        {"step_seconds_dense", dense_step},
        {"step_seconds_dgc", dgc_step},
        {"speedup", dense_step / dgc_step},
        {"wire_bytes_sent_per_rank", r.dgc.bytes.wire_sent},
        {"wire_bytes_received_per_rank", r.dgc.bytes.wire_received},
        {"dense_wire_bytes_per_rank", r.dense.bytes.wire_sent},
        {"message_bytes", r.dgc.bytes.message},
        {"dense_gradient_bytes", r.dgc.bytes.dense_gradient},
        {"compression_ratio", r.dgc.bytes.message > 0
                                  ? static_cast<double>(r.dgc.bytes.dense_gradient) /
                                        static_cast<double>(r.dgc.bytes.message)
                                  : 0.0},
        {"scaling_efficiency_dense", optional(eff_dense)},
        {"scaling_efficiency_dgc", optional(eff_dgc)},
        {"dgc_compress_seconds", r.dgc.compress},
        {"dgc_exchange_seconds", r.dgc.exchange},
        {"dgc_update_seconds", r.dgc.update},
        {"dense_exchange_seconds", r.dense.exchange},
        {"dense_other_seconds", r.dense.compress + r.dense.update},
        {"dgc_own_seconds", dgc_own},
        {"core_step_seconds", r.dgc.bound},
        {"dgc_own_ratio_to_core_step", dgc_own / r.dgc.bound},
        {"dense_bound_seconds", r.dense.bound},
        {"dense_own_ratio_to_bound", dense_own / r.dense.bound},
    };
    if (gbit > 0) {
      j["bandwidth_gbit"] = gbit;
      j["dgc_wire_seconds"] = wire(r.dgc);
      j["dgc_waiting_seconds"] = std::max(0.0, r.dgc.exchange - wire(r.dgc));
      j["dense_wire_seconds"] = wire(r.dense);
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s (%lld parameters), %d workers, link %s, compute %.3f s%s\n", r.model.c_str(),
                static_cast<long long>(r.parameters), r.workers, o.link.c_str(), r.compute,
                r.compute_default ? " (default)" : "");
    std::printf("  step: dense %.4f s, DGC %.4f s, speedup %.2fx\n", dense_step, dgc_step,
                dense_step / dgc_step);
    std::printf(
        "  DGC step parts (slowest rank, median): compress %.4f s, exchange %.4f s, update "
        "%.4f s; dense exchange %.4f s\n",
        r.dgc.compress, r.dgc.exchange, r.dgc.update, r.dense.exchange);
    std::printf("  per rank and step: DGC sent %llu B on the wire (message %llu B), dense %llu B\n",
                static_cast<unsigned long long>(r.dgc.bytes.wire_sent),
                static_cast<unsigned long long>(r.dgc.bytes.message),
                static_cast<unsigned long long>(r.dense.bytes.wire_sent));
    std::printf(
        "  own work (compress + update): DGC %.4f s = %.2fx the core's fused step on the same "
        "elements (%.4f s); dense %.4f s = %.2fx its streaming bound (%.4f s)\n",
        dgc_own, dgc_own / r.dgc.bound, r.dgc.bound, dense_own, dense_own / r.dense.bound,
        r.dense.bound);
    if (eff_dense && eff_dgc) {
      std::printf("  scaling efficiency: dense %.3f, DGC %.3f\n", *eff_dense, *eff_dgc);
    }
  }
  std::fflush(stdout);
}

void validate(const BenchStepOptions& o) {
  for (const auto& m : o.models) train::model_shapes(m);  // throws for an unknown name
  DGC_CHECK_GE(o.steps, 1, "--steps must be >= 1");
  DGC_CHECK_GE(o.untimed_iterations, 0, "--untimed-iterations must be >= 0");
  DGC_CHECK_GE(o.variants, 1, "--gradient-variants must be >= 1");
  check_density(o.density, "--density");
  DGC_CHECK_GT(o.timeout_seconds, 0.0, "--timeout must be positive");
  DGC_CHECK_GE(o.bandwidth_gbit, 0.0, "--bandwidth-gbit must be >= 0");
}

// Runs every model on `comm`; rank 0 prints a row per model.
void run_models(comm::Communicator& comm, const BenchStepOptions& o, int threads_per_rank) {
  torch::set_num_threads(threads_per_rank);
  for (const auto& model : o.models) {
    const auto shapes = train::model_shapes(model);
    Row row;
    row.model = model;
    row.parameters = train::parameter_count(shapes);
    row.workers = comm.size();
    row.compute_default = o.compute_seconds < 0;
    row.compute = row.compute_default ? default_compute_seconds().at(model) : o.compute_seconds;
    std::unique_ptr<StepBounds> bounds;  // rank 0's
    if (comm.rank() == 0) {
      CompressionOptions compressor;  // as measure() configures the step's compressor
      compressor.seed = o.seed;
      bounds = std::make_unique<StepBounds>(row.parameters, o.density, compressor, o.variants,
                                            o.seed + 1);
    }
    if (!o.skip_single && comm.rank() == 0) {
      // The one-rank baseline: a world of one in this process, nothing on the wire.
      comm::GlooOptions gloo;
      gloo.timeout = comm::Timeout{static_cast<int64_t>(o.timeout_seconds * 1000.0)};
      comm::run_local(1, gloo, [&](comm::Communicator& single) {
        row.dense_single = measure(single, shapes, train::Compression::kNone, o, model);
        row.dgc_single = measure(single, shapes, train::Compression::kDgc, o, model);
      });
    }
    row.dense = measure(comm, shapes, train::Compression::kNone, o, model, bounds.get());
    row.dgc = measure(comm, shapes, train::Compression::kDgc, o, model, bounds.get());
    if (comm.rank() == 0) print(row, o);
  }
}

void run_bench_step(const BenchStepOptions& o) {
  validate(o);
  const comm::LaunchEnv env = comm::detect_launch();
  comm::ConnectOptions connect;
  connect.workers = o.workers;
  connect.gloo.hostname = o.hostname;
  connect.gloo.timeout = comm::Timeout{static_cast<int64_t>(o.timeout_seconds * 1000.0)};
  comm::Connection connection = comm::connect(env, connect);
  const int threads = comm::threads_per_worker(env, o.workers);
  comm::run_ranks(connection, [&](comm::Communicator& comm) { run_models(comm, o, threads); });
}

}  // namespace

void add_bench_step(CLI::App& bench) {
  auto o = std::make_shared<BenchStepOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "step",
      "Complete SGD steps (compression, exchange, decode, update) of ResNet-50, AlexNet, VGG-16 "
      "and the paper's PTB LSTM over their real tensor shapes, dense and DGC in the same run; "
      "forward/backward replaced by a stated compute time");
  cmd->add_option("--model", o->models,
                  "resnet50, alexnet, vgg16, lstm-ptb, cnn (repeat the flag, or 'all')")
      ->capture_default_str()
      ->allow_extra_args(false)
      ->each([o](const std::string& m) {
        if (m == "all") return;
        train::model_shapes(m);
      });
  cmd->add_option("--compute-seconds", o->compute_seconds,
                  "Forward+backward time per step (default: per model, a published GPU figure; "
                  "see the source)");
  cmd->add_option("--workers", o->workers,
                  "Ranks as threads in this process (default 4); under a launcher: must equal the "
                  "world size if given");
  cmd->add_option("--steps", o->steps, "Timed steps (median reported)")->capture_default_str();
  cmd->add_option("--untimed-iterations", o->untimed_iterations, "Untimed steps before them")
      ->capture_default_str();
  cmd->add_option("--gradient-variants", o->variants,
                  "Distinct synthetic gradients per rank, used in turn")
      ->capture_default_str();
  cmd->add_option("--density", o->density, "DGC density d")->capture_default_str();
  cmd->add_option("--link", o->link, "Name of the link, copied to the output")
      ->capture_default_str();
  cmd->add_option("--bandwidth-gbit", o->bandwidth_gbit,
                  "Link rate in Gbit/s: report wire time (rank 0's bytes / rate) and waiting");
  cmd->add_option("--hostname", o->hostname,
                  "Gloo: address to bind for data connections (e.g. this network namespace's)");
  cmd->add_option("--timeout", o->timeout_seconds, "Seconds per collective and for rendezvous")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seeds the weights, gradients and sampling")
      ->capture_default_str();
  cmd->add_flag("--no-single", o->skip_single,
                "Skip the one-rank baseline (no scaling efficiency)");
  cmd->add_flag("--json", o->json, "One JSON object per model");
  cmd->callback([o] {
    if (std::find(o->models.begin(), o->models.end(), "all") != o->models.end()) {
      o->models = train::model_shape_names();
    }
    run_bench_step(*o);
  });
}

}  // namespace dgc::cli
