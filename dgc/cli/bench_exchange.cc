// dgc bench exchange: the DGC exchange vs a dense allreduce of the same gradient, in the same run.
//
// What is measured, per rank:
//   - a gradient of `numel` floats for one compressed tensor (shape {numel}, compressed path; the
//     default 25,557,032 is ResNet-50's parameter count) plus an optional dense-path part of
//     `dense_numel` floats; values are uniform in [-1, 1), a pure function of (seed, rank,
//     variant, index). `gradients` variants per rank are used in turn by the iterations, so
//     consecutive iterations send different positions, as in training;
//   - the selection: dgc::select_sampled at the density (the paper's sampled threshold), made
//     before timing; one is timed and reported as select_seconds, outside the exchange time;
//   - dgc_seconds: Exchange::run with the algorithm of --exchange (allgather, direct,
//     sparse-allreduce or auto; with dense_numel > 0 also the dense allreduce), `repeats` timed
//     iterations after `untimed_iterations` untimed ones, a barrier before each; per iteration the
//     slowest rank's time, then the median over iterations. The phases (encode, collective,
//     validate, decode) are the Exchange's own timings (Exchange::last_timings), same statistic;
//   - dense_seconds: allreduce_sum of the whole gradient (numel + dense_numel floats), same
//     timing rule, `dense_repeats` iterations after one untimed one.
// Verification (outside timing): every rank regenerates every rank's gradient from the seeds,
// repeats its selection, gathers what the exchange handed back to every rank (sparse-allreduce),
// and checks its exchange output with dgc::check_update (reference.h, the check the exchange
// tests use: the direct sum of what was applied / N, zero elsewhere); the dense allreduce result
// is checked against the directly computed sum. Any mismatch fails the command after printing.
//
// Launch: through comm::connect(), as every dgc command: N worker threads in this process over
// Gloo (default); one rank per process under mpirun (MPI, or Gloo with --rendezvous DIR), under
// torchrun or with the four variables set by hand (Gloo over TCP). Rank 0 prints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/bench_exchange.h"
#include "dgc/cli/commands.h"
#include "dgc/cli/statistics.h"
#include "dgc/comm/communicator.h"
#include "dgc/comm/launch.h"
#include "dgc/core/codec.h"
#include "dgc/core/compressor.h"
#include "dgc/core/error.h"
#include "dgc/core/options.h"
#include "dgc/core/policy.h"
#include "dgc/core/selection.h"
#include "dgc/exchange/exchange.h"
#include "dgc/exchange/reference.h"

namespace dgc::cli {
namespace {

using namespace bench_exchange;

template <typename T>
std::vector<std::vector<T>> gather_all(comm::Communicator& comm, std::span<const T> values,
                                       comm::Timeout timeout) {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(values.data()),
                                       values.size_bytes());
  std::vector<std::vector<uint8_t>> messages = comm.allgatherv(bytes, timeout);
  std::vector<std::vector<T>> out(messages.size());
  for (size_t r = 0; r < messages.size(); ++r) {
    DGC_CHECK_EQ(messages[r].size() % sizeof(T), size_t{0}, "gathered message from rank ", r,
                 " is not a whole number of elements");
    out[r].resize(messages[r].size() / sizeof(T));
    std::memcpy(out[r].data(), messages[r].data(), messages[r].size());
  }
  return out;
}

// Per iteration the slowest rank's time; then median and minimum over iterations.
std::pair<double, double> slowest_rank_stats(comm::Communicator& comm,
                                             const std::vector<double>& local,
                                             comm::Timeout timeout) {
  const auto all = gather_all<double>(comm, local, timeout);
  std::vector<double> slowest(local.size(), 0.0);
  for (const auto& times : all) {
    DGC_CHECK_EQ(times.size(), local.size(), "ranks timed different numbers of iterations");
    for (size_t i = 0; i < times.size(); ++i) slowest[i] = std::max(slowest[i], times[i]);
  }
  return {median(slowest), *std::min_element(slowest.begin(), slowest.end())};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result run_rank(comm::Communicator& comm, const BenchExchangeOptions& o,
                const std::string& launch) {
  const comm::Timeout timeout{static_cast<int64_t>(o.timeout_seconds * 1000.0)};
  const int n = comm.size();
  const int rank = comm.rank();
  const auto numel = static_cast<size_t>(o.numel);
  const auto dense_numel = static_cast<size_t>(o.dense_numel);

  // The gradient: compressed tensor first, then the dense-path part, one buffer. Variant 0 last,
  // so that the buffer holds it afterwards.
  std::vector<float> gradient(numel + dense_numel);
  const std::span<const float> compressed_grad(gradient.data(), numel);
  std::vector<Selection> variants(static_cast<size_t>(o.gradients));
  double select_seconds = 0.0;  // gradient 0's selection
  auto start = std::chrono::steady_clock::now();
  for (int k = 1; k <= o.gradients; ++k) {
    const int v = k % o.gradients;
    fill_gradient(o.seed, rank, v, gradient);
    start = std::chrono::steady_clock::now();
    select_for_rank(o, rank, v, compressed_grad, variants[v]);
    if (v == 0) select_seconds = seconds_since(start);
  }

  std::vector<TensorSpec> layout;
  layout.push_back({"compressed", {o.numel}, TensorPath::kCompressed});
  if (dense_numel > 0) layout.push_back({"dense", {o.dense_numel}, TensorPath::kDense});
  ExchangeOptions exchange_options;
  exchange_options.value_type = parse_value_type(o.value_type);
  exchange_options.timeout = timeout;
  exchange_options.algorithm = parse_exchange_algorithm(o.exchange);
  exchange_options.density = o.density;
  // What every rank must agree on, as "key=value" lines (checked by the handshake; the exchange
  // adds its algorithm).
  exchange_options.settings = detail::concat(
      "bench.density=", o.density, "\nbench.seed=", o.seed, "\nbench.gradients=", o.gradients,
      "\nbench.repeats=", o.repeats, "\nbench.untimed_iterations=", o.untimed_iterations, "\n");
  Exchange exchange(comm, layout, exchange_options);

  std::vector<float> update(numel);
  std::vector<float> dense_flat(dense_numel);
  const std::span<float> update_span(update);
  const std::span<const std::span<float>> updates(&update_span, 1);
  const std::span<const float> dense_grad(gradient.data() + numel, dense_numel);

  uint64_t iteration = 0;
  std::vector<double> dgc_times, encode, collective, validate, decode;
  std::vector<Selection> unapplied(1);
  int bad_ranks = 0;
  for (int i = 0; i < o.untimed_iterations + o.repeats; ++i) {
    std::copy(dense_grad.begin(), dense_grad.end(), dense_flat.begin());
    comm.barrier(timeout);
    start = std::chrono::steady_clock::now();
    const std::span<const Selection> selections(&variants[static_cast<size_t>(i) % variants.size()],
                                                1);
    bad_ranks += exchange.run(iteration++, selections, updates, dense_flat, true, unapplied);
    const double seconds = seconds_since(start);
    if (i >= o.untimed_iterations) {
      dgc_times.push_back(seconds);
      const ExchangeTimings& t = exchange.last_timings();
      encode.push_back(t.encode);
      collective.push_back(t.collective);
      validate.push_back(t.validate);
      decode.push_back(t.decode);
    }
  }
  DGC_CHECK_EQ(bad_ranks, 0, "no rank flags its gradient in this benchmark");
  const ExchangeBytes dgc_bytes = exchange.last();
  const uint64_t applied = exchange.last_applied();
  // The gradient variant whose exchange result `update` holds, and what every rank got back.
  const int variant = (o.untimed_iterations + o.repeats - 1) % o.gradients;
  const auto all_unapplied = gather_unapplied(comm, unapplied[0], timeout);
  Phases phases;
  phases.encode = slowest_rank_stats(comm, encode, timeout).first;
  phases.collective = slowest_rank_stats(comm, collective, timeout).first;
  phases.validate = slowest_rank_stats(comm, validate, timeout).first;
  phases.decode = slowest_rank_stats(comm, decode, timeout).first;

  // Dense baseline: allreduce of the whole gradient, a fresh copy each time.
  std::vector<float> dense(gradient.size());
  std::vector<double> dense_times;
  uint64_t dense_sent = 0;
  uint64_t dense_received = 0;
  for (int i = 0; i < 1 + o.dense_repeats; ++i) {
    std::copy(gradient.begin(), gradient.end(), dense.begin());
    comm.barrier(timeout);
    const comm::ByteCounters before = comm.bytes();
    start = std::chrono::steady_clock::now();
    comm.allreduce_sum(dense, timeout);
    const double seconds = seconds_since(start);
    if (i >= 1) {
      dense_times.push_back(seconds);
      dense_sent += comm.bytes().sent - before.sent;
      dense_received += comm.bytes().received - before.received;
    }
  }
  dense_sent /= o.dense_repeats;
  dense_received /= o.dense_repeats;

  // Verification, outside timing. `gradient` is free now: it serves as scratch for peers.
  int64_t dense_mismatches = verify_dense(o, n, dense);
  dense = {};
  std::string first_problem;
  int64_t dgc_mismatches =
      verify_exchange(o, n, rank, variant, variants[static_cast<size_t>(variant)], all_unapplied,
                      update, dense_flat, std::span<float>(gradient), first_problem);

  // Combine over ranks.
  Result res;
  res.backend = comm.backend();
  res.launch = launch;
  res.workers = n;
  res.numel = o.numel;
  res.dense_numel = o.dense_numel;
  res.density = o.density;
  res.value_type = o.value_type;
  res.exchange = o.exchange;
  res.algorithm = to_string(exchange.algorithm());
  res.first_problem = first_problem;
  res.phases = phases;
  res.repeats = o.repeats;
  res.dense_repeats = o.dense_repeats;
  res.gradients = o.gradients;
  std::tie(res.dgc_seconds, res.dgc_seconds_min) = slowest_rank_stats(comm, dgc_times, timeout);
  std::tie(res.dense_seconds, res.dense_seconds_min) =
      slowest_rank_stats(comm, dense_times, timeout);
  res.select_seconds = slowest_rank_stats(comm, {select_seconds}, timeout).first;

  const std::vector<uint64_t> mine = {variants[0].indices.size(),
                                      dgc_bytes.message,
                                      dgc_bytes.dense_gradient,
                                      dgc_bytes.wire_sent,
                                      dgc_bytes.wire_received,
                                      dense_sent,
                                      dense_received,
                                      static_cast<uint64_t>(dgc_mismatches),
                                      static_cast<uint64_t>(dense_mismatches),
                                      applied,
                                      unapplied[0].indices.size()};
  uint64_t dgc_bad = 0;
  uint64_t dense_bad = 0;
  for (const auto& v : gather_all<uint64_t>(comm, mine, timeout)) {
    DGC_CHECK_EQ(v.size(), mine.size(), "ranks gathered different statistics");
    res.selected_per_rank = std::max(res.selected_per_rank, v[0]);
    res.message_bytes = std::max(res.message_bytes, v[1]);
    res.dense_gradient_bytes = std::max(res.dense_gradient_bytes, v[2]);
    res.wire_bytes_sent_per_rank = std::max(res.wire_bytes_sent_per_rank, v[3]);
    res.wire_bytes_received_per_rank = std::max(res.wire_bytes_received_per_rank, v[4]);
    res.busiest_link_bytes = std::max({res.busiest_link_bytes, v[3], v[4]});
    res.dense_wire_bytes_per_rank = std::max(res.dense_wire_bytes_per_rank, v[5]);
    res.dense_busiest_link_bytes = std::max({res.dense_busiest_link_bytes, v[5], v[6]});
    dgc_bad += v[7];
    dense_bad += v[8];
    res.applied = std::max(res.applied, v[9]);
    res.returned_per_rank = std::max(res.returned_per_rank, v[10]);
  }
  res.verified = dgc_bad == 0;
  res.dense_verified = dense_bad == 0;
  res.mismatches = static_cast<int64_t>(dgc_bad + dense_bad);
  return res;
}

void validate(const BenchExchangeOptions& o) {
  DGC_CHECK_GT(o.numel, 0, "--numel must be positive");
  DGC_CHECK_LE(o.numel, int64_t{1} << 32, "--numel must fit 32-bit indices");
  DGC_CHECK_GE(o.dense_numel, 0, "--dense-numel must be >= 0");
  check_density(o.density, "--density");
  DGC_CHECK_GE(o.repeats, 1, "--repeats must be >= 1");
  DGC_CHECK_GE(o.untimed_iterations, 0, "--untimed-iterations must be >= 0");
  DGC_CHECK_GE(o.dense_repeats, 1, "--dense-repeats must be >= 1");
  DGC_CHECK_GE(o.gradients, 1, "--gradients must be >= 1");
  DGC_CHECK_GE(o.bandwidth_gbit, 0.0, "--bandwidth-gbit must be >= 0");
  DGC_CHECK_GT(o.timeout_seconds, 0.0, "--timeout must be positive");
  DGC_CHECK_GE(o.workers, 0, "--workers must be positive");
  parse_value_type(o.value_type);
}

void run_bench_exchange(const BenchExchangeOptions& o) {
  validate(o);
  // How to connect: the same rules and messages as every dgc command (comm::connect).
  const comm::LaunchEnv env = comm::detect_launch();
  comm::ConnectOptions connect_options;
  if (o.backend != "auto") connect_options.backend = comm::parse_backend(o.backend);
  connect_options.workers = o.workers;
  connect_options.rendezvous = o.rendezvous;
  connect_options.gloo.hostname = o.hostname;
  connect_options.gloo.timeout = comm::Timeout{static_cast<int64_t>(o.timeout_seconds * 1000.0)};
  auto connection = comm::connect(env, connect_options);
  const std::string launch = env.kind == comm::LaunchEnv::Kind::kLocal ? "local"
                             : env.kind == comm::LaunchEnv::Kind::kMpi ? "mpi"
                                                                       : "torchrun";

  std::optional<Result> result;
  std::mutex mutex;
  comm::run_ranks(connection, [&](comm::Communicator& comm) {
    Result r = run_rank(comm, o, launch);
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      result = std::move(r);
    } else if (connection.ranks.size() == 1 && (!r.verified || !r.dense_verified)) {
      // A process of its own: say so here (rank 0 prints the result and says it too).
      throw Error("bench exchange: verification failed on rank " + std::to_string(comm.rank()) +
                  " (" + std::to_string(r.mismatches) + " mismatched elements over all ranks)");
    }
  });
  if (!result) return;  // not rank 0: nothing to print
  print_result(*result, o);
  if (!result->verified || !result->dense_verified) {
    throw Error("bench exchange: verification failed (" + std::to_string(result->mismatches) +
                " mismatched elements over all ranks)");
  }
}

}  // namespace

void add_bench_exchange(CLI::App& bench) {
  auto options = std::make_shared<BenchExchangeOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "exchange",
      "DGC exchange vs dense allreduce of the same gradient, same run (local threads, mpirun or "
      "torchrun variables)");
  cmd->add_option("--backend", options->backend,
                  "auto (mpi under mpirun, gloo otherwise), gloo or mpi")
      ->check(CLI::IsMember({"auto", "gloo", "mpi"}))
      ->capture_default_str();
  cmd->add_option("--rendezvous", options->rendezvous,
                  "Shared directory where Gloo ranks meet (one process per rank: under mpirun "
                  "with --backend gloo, or under torchrun instead of the TCP store)");
  cmd->add_option("--workers", options->workers,
                  "Ranks as threads in this process (default 4); under a launcher: must equal "
                  "the world size if given");
  cmd->add_option("--numel", options->numel,
                  "Elements of the compressed tensor (default: ResNet-50's 25,557,032)")
      ->capture_default_str();
  cmd->add_option("--dense-numel", options->dense_numel,
                  "Elements of an extra dense-path tensor (allreduced inside the exchange)")
      ->capture_default_str();
  cmd->add_option("--density", options->density, "Fraction of elements each rank sends")
      ->capture_default_str();
  cmd->add_option("--value-type", options->value_type, "Wire type of values: fp32 | fp16 | bf16")
      ->capture_default_str()
      ->check(CLI::IsMember(names_of(kValueTypeNames)));
  cmd->add_option("--repeats", options->repeats, "Timed DGC exchange iterations (median reported)")
      ->capture_default_str();
  cmd->add_option("--untimed-iterations", options->untimed_iterations,
                  "Untimed DGC exchange iterations before those")
      ->capture_default_str();
  cmd->add_option("--dense-repeats", options->dense_repeats,
                  "Timed dense allreduces (after one untimed)")
      ->capture_default_str();
  cmd->add_option("--gradients", options->gradients,
                  "Distinct gradients per rank, used in turn (consecutive iterations select "
                  "different positions, as in training)")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seeds the gradients and the sampling")
      ->capture_default_str();
  cmd->add_option("--bandwidth-gbit", options->bandwidth_gbit,
                  "Link rate in Gbit/s: report wire-time bounds (busiest link bytes / rate)");
  cmd->add_option("--hostname", options->hostname,
                  "Gloo: address to bind for data connections (e.g. this network namespace's)");
  cmd->add_option("--timeout", options->timeout_seconds,
                  "Seconds per collective and for the rendezvous")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print one JSON object per line");
  cmd->add_option("--exchange", options->exchange,
                  "Exchange algorithm: allgather, direct, sparse-allreduce or auto")
      ->check(CLI::IsMember(names_of(kExchangeAlgorithmNames)))
      ->capture_default_str();
  cmd->callback([options] { run_bench_exchange(*options); });
}

}  // namespace dgc::cli
