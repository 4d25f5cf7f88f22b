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
// With --replay the forward and backward passes are replayed instead: after the barrier the
// gradients become ready one by one in backward order (the last tensor first), tensor i at
// compute_seconds x (forward FLOPs of the tensors from i to the last) / (the model's forward FLOPs)
// (train::forward_flops: the backward pass takes about twice each layer's forward FLOPs, the same
// proportions); the timed step runs from the start of that replay to the end of step(), and holds
// the compute. Dense and DGC run twice each: one message after the backward pass (bucket cap 0),
// and in gradient buckets of --bucket-cap-mb overlapped with the replay (dgc/train/buckets.h).
//
// Timing: before each step a barrier (untimed); every rank times its own step(); the step's time
// is the slowest rank's, the reported figure the median over `steps` timed steps (after
// `untimed_iterations` untimed ones). Without --replay the time per training step is
//   step_seconds = compute_seconds + that median,
// where compute_seconds stands for the forward and backward pass on an accelerator (a setting;
// see dgc/sim/compute.h for the defaults and their sources): the optimizer step after the backward
// pass, not overlapped with it, as in the paper; with --replay it is the median itself.
// Scaling efficiency = N-rank throughput / (N x one-rank throughput) = step_1 / step_N, where
// step_1 is measured in this process on a world of one (compute + the local optimizer step,
// nothing on the wire) before the N-rank runs.
//
// Without --replay, the step's own work (compress + update: everything but the exchange, slowest
// rank, medians) is printed against two figures rank 0 measures in the same process on the same
// number of elements (bench_step_bounds.h), one pass after each step (after the timings are
// gathered, before the next barrier): DGC's against the core's fused step (Compressor::step on
// one tensor of all the elements), the dense optimizer's against its streaming bound (one pass of
// momentum SGD with weight decay over g, u and w).
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
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/bench_step.h"
#include "dgc/cli/bench_step_bounds.h"
#include "dgc/cli/commands.h"
#include "dgc/cli/statistics.h"
#include "dgc/comm/launch.h"
#include "dgc/core/error.h"
#include "dgc/sim/compute.h"
#include "dgc/train/model_shapes.h"
#include "dgc/train/optimizer.h"

namespace dgc::cli {
namespace {

using bench_step::BenchStepOptions;
using bench_step::Measured;
using bench_step::Row;

// The default compute time per step (forward + backward on one accelerator) and its sources:
// dgc/sim/compute.h, shared with the simulated cluster and `dgc plan`. lstm-ptb and cnn have no
// published figure (0.1 s, flagged as a default in the output: pass --compute-seconds); the
// issue's reference figure for ResNet-50 is 0.1 s (pass --compute-seconds 0.1).
using sim::default_compute_seconds;

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

// Runs the steps of one configuration on this rank (collective). The result is the same on every
// rank.
// `ready_at`: empty, or with replay when each tensor's gradient is ready, in seconds after the
// start of the backward pass; `cap_mb`: the bucket cap (0: one message).
Measured measure(comm::Communicator& comm, const std::vector<train::NamedShape>& shapes,
                 train::Compression compression, const BenchStepOptions& o,
                 const std::string& model, const std::vector<double>& ready_at = {},
                 double cap_mb = 0.0, StepBounds* bounds = nullptr) {
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
  options.bucket_cap_mb = cap_mb;
  options.last_bucket_cap_mb = o.last_bucket_cap_mb;
  train::DistributedOptimizer optimizer(comm, module, options, "model=" + model);

  const int world = comm.size();
  std::vector<double> steps, compress, exchange, update, wait, bound;
  Measured m;
  m.buckets = optimizer.bucketed_step().bucket_count();
  for (int s = 0; s < o.untimed_iterations + o.steps; ++s) {
    const auto& grads = variants[static_cast<size_t>(s % o.variants)];
    if (ready_at.empty()) {
      for (size_t i = 0; i < module.params.size(); ++i) module.params[i].mutable_grad() = grads[i];
    }
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    // The replayed backward pass: every gradient at its time, last tensor first.
    for (size_t i = ready_at.size(); i-- > 0;) {
      std::this_thread::sleep_until(start + std::chrono::duration<double>(ready_at[i]));
      module.params[i].mutable_grad() = grads[i];
      optimizer.gradient_ready(i);
    }
    optimizer.step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The slowest rank's times, outside the timing.
    const auto& t = optimizer.last_timings();
    const auto& b = optimizer.last_bytes();
    std::vector<float> all(static_cast<size_t>(5 * world), 0.0f);
    const size_t r = static_cast<size_t>(comm.rank());
    all[r] = static_cast<float>(seconds);
    all[world + r] = static_cast<float>(t.compress);
    all[2 * world + r] = static_cast<float>(t.exchange);
    all[3 * world + r] = static_cast<float>(t.update);
    all[4 * world + r] = static_cast<float>(optimizer.last_wait_seconds());
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
    wait.push_back(column_max(4));
    bound.push_back(bound_seconds);
    m.bytes = b;
  }
  m.step = median(steps);
  m.compress = median(compress);
  m.exchange = median(exchange);
  m.update = median(update);
  m.wait = median(wait);
  m.bound = median(bound);
  return m;
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
    if (o.replay) {
      // The backward pass in proportion to each layer's forward FLOPs: tensor i's gradient is
      // ready once the layers after it and its own have run.
      const std::vector<double> flops = train::forward_flops(model);
      double total = 0.0;
      for (const double f : flops) total += f;
      std::vector<double> ready_at(flops.size());
      double done = 0.0;
      for (size_t i = flops.size(); i-- > 0;) {
        done += flops[i];
        ready_at[i] = row.compute * done / total;
      }
      row.dense_one_message = measure(comm, shapes, train::Compression::kNone, o, model, ready_at);
      row.dense =
          measure(comm, shapes, train::Compression::kNone, o, model, ready_at, o.bucket_cap_mb);
      row.dgc_one_message = measure(comm, shapes, train::Compression::kDgc, o, model, ready_at);
      row.dgc =
          measure(comm, shapes, train::Compression::kDgc, o, model, ready_at, o.bucket_cap_mb);
      if (comm.rank() == 0) bench_step::print(row, o);
      continue;
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
    std::unique_ptr<StepBounds> bounds;  // rank 0's
    if (comm.rank() == 0) {
      CompressionOptions compressor;  // as measure() configures the step's compressor
      compressor.seed = o.seed;
      bounds = std::make_unique<StepBounds>(row.parameters, o.density, compressor, o.variants,
                                            o.seed + 1);
    }
    row.dense = measure(comm, shapes, train::Compression::kNone, o, model, {}, 0.0, bounds.get());
    row.dgc = measure(comm, shapes, train::Compression::kDgc, o, model, {}, 0.0, bounds.get());
    if (comm.rank() == 0) bench_step::print(row, o);
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
  cmd->add_flag("--replay", o->replay,
                "Replay the backward pass: each gradient at its time in backward order, the "
                "compute spread over the layers in proportion to their forward FLOPs; dense and "
                "DGC each with one message after the backward pass and in buckets overlapped "
                "with it (no one-rank baseline)");
  cmd->add_option("--bucket-cap-mb", o->bucket_cap_mb,
                  "With --replay: the overlapped runs' gradient bucket cap (MB, as DDP's)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--last-bucket-cap-mb", o->last_bucket_cap_mb,
                  "With --replay: the overlapped runs' last bucket at most this size (MB; 0: as "
                  "the cap gives it), as dgc train's --last-bucket-cap-mb")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([o] {
    if (std::find(o->models.begin(), o->models.end(), "all") != o->models.end()) {
      o->models = train::model_shape_names();
    }
    run_bench_step(*o);
  });
}

}  // namespace dgc::cli
