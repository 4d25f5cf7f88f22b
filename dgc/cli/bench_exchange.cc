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

struct BenchExchangeOptions {
  // "auto" (mpi under mpirun, gloo otherwise), "gloo" or "mpi".
  std::string backend = "auto";
  std::string rendezvous;  // Gloo under a launcher: shared directory instead of the TCP store
  // Worker threads in local mode. In multi-process mode the world size comes from the launcher
  // (0 here: take it; otherwise it must match).
  int workers = 0;
  int64_t numel = 25'557'032;  // elements of the compressed tensor (ResNet-50's parameter count)
  int64_t dense_numel = 0;     // elements of the dense-path part (0: none)
  double density = 0.001;      // d: fraction of the compressed tensor each rank sends
  std::string value_type = "fp32";  // wire type of the values: fp32 | fp16 | bf16
  int repeats = 20;                 // timed DGC exchange iterations
  int untimed_iterations = 2;       // untimed DGC exchange iterations before them
  int dense_repeats = 3;            // timed dense allreduces (after one untimed)
  // Distinct gradients per rank, used in turn by the iterations, so that consecutive iterations
  // select different positions as in training (a repeated selection would find the positions it
  // writes in cache). Gradient 0 also feeds the dense baseline and the dense-path part.
  int gradients = 4;
  uint64_t seed = 1;                   // seeds the gradients and the sampling
  double bandwidth_gbit = 0.0;         // > 0: report wire-time bounds at this link rate
  std::string hostname;                // Gloo: address to bind (empty: from the rendezvous)
  double timeout_seconds = 120.0;      // per collective and for rendezvous
  bool json = false;                   // one JSON object per line instead of a table
  std::string exchange = "allgather";  // allgather | direct | sparse-allreduce | auto
};

// splitmix64's finalizer: a bijective 64-bit mix.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Rank `rank`'s gradient number `variant` (see BenchExchangeOptions::gradients).
uint64_t gradient_stream(uint64_t seed, int rank, int variant) {
  return mix64(mix64(seed + static_cast<uint64_t>(variant)) ^
               (0x632be59bd9b4e019ULL * (static_cast<uint64_t>(rank) + 1)));
}

// Gradient element `index` of rank `stream`: uniform in [-1, 1) on a 2^-23 grid.
float gradient_value(uint64_t stream, uint64_t index) {
  const uint64_t h = mix64(stream + index * 0xd1b54a32d192ed03ULL);
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * 0x1p-23f;
}

void fill_gradient(uint64_t seed, int rank, int variant, std::span<float> out) {
  const uint64_t stream = gradient_stream(seed, rank, variant);
  for (size_t i = 0; i < out.size(); ++i) out[i] = gradient_value(stream, i);
}

std::mt19937_64 selection_rng(uint64_t seed, int rank, int variant) {
  return std::mt19937_64(mix64(gradient_stream(seed, rank, variant) ^ 0x5e1ec7ULL));
}

// The selection rank `rank` makes on its gradient `variant` (a pure function of seed, rank and
// variant).
void select_for_rank(const BenchExchangeOptions& o, int rank, int variant,
                     std::span<const float> gradient, Selection& out) {
  std::mt19937_64 rng = selection_rng(o.seed, rank, variant);
  select_sampled(gradient, target_count(gradient.size(), o.density), o.density, SelectionOptions{},
                 rng, out);
}

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

// The Exchange's phases (ExchangeTimings): per iteration the slowest rank's, median over
// iterations.
struct Phases {
  double encode = 0.0;
  double collective = 0.0;
  double validate = 0.0;
  double decode = 0.0;
};

// Everything rank 0 prints; computed collectively, so identical on every rank.
struct Result {
  std::string backend;
  std::string launch;
  int workers = 0;
  int64_t numel = 0;
  int64_t dense_numel = 0;
  double density = 0.0;
  std::string value_type;
  std::string exchange;            // as requested (--exchange)
  std::string algorithm;           // what the exchange runs (auto resolved)
  uint64_t selected_per_rank = 0;  // max over ranks
  uint64_t applied = 0;            // elements added into the update in the last iteration (max)
  uint64_t returned_per_rank = 0;  // elements handed back to a rank in the last iteration (max)
  int repeats = 0;
  int dense_repeats = 0;
  int gradients = 0;
  double select_seconds = 0.0;  // slowest rank's selection time
  double dgc_seconds = 0.0;
  double dgc_seconds_min = 0.0;
  double dense_seconds = 0.0;
  double dense_seconds_min = 0.0;
  uint64_t message_bytes = 0;             // max over ranks: encoded message + dense-path floats
  uint64_t dense_gradient_bytes = 0;      // 4 x every element
  uint64_t wire_bytes_sent_per_rank = 0;  // DGC wire bytes sent, max over ranks, per iteration
  uint64_t wire_bytes_received_per_rank = 0;
  uint64_t busiest_link_bytes = 0;         // max over ranks and directions (star network)
  uint64_t dense_wire_bytes_per_rank = 0;  // the dense allreduce's wire bytes sent, max
  uint64_t dense_busiest_link_bytes = 0;
  bool verified = false;
  bool dense_verified = false;
  int64_t mismatches = 0;     // summed over ranks (DGC and dense)
  std::string first_problem;  // rank 0's first verification problem, if any
  Phases phases;
};

// Checks this rank's exchange output with the reference (dgc::check_update): every rank's
// selection regenerated from the seeds, every rank's `unapplied` as gathered. The dense-path part
// against the directly computed average. Returns the number of mismatches.
int64_t verify_exchange(const BenchExchangeOptions& o, int world_size, int my_rank, int variant,
                        const Selection& my_selection, std::span<const Selection> unapplied,
                        std::span<const float> update, std::span<const float> dense_part,
                        std::span<float> scratch, std::string& first_problem) {
  const ValueType type = parse_value_type(o.value_type);
  std::vector<Selection> selected(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    if (r == my_rank) {
      selected[r] = my_selection;
      continue;
    }
    const std::span<float> peer_gradient = scratch.first(static_cast<size_t>(o.numel));
    fill_gradient(o.seed, r, variant, peer_gradient);
    select_for_rank(o, r, variant, peer_gradient, selected[r]);
  }
  const ReferenceCheck check = check_update(selected, unapplied, update, type);
  int64_t mismatches = check.mismatches;
  if (!check.ok()) first_problem = check.first;

  // Dense-path part: the average over ranks.
  const double inv_n = 1.0 / world_size;
  for (size_t j = 0; j < dense_part.size(); ++j) {
    const uint64_t position = static_cast<uint64_t>(o.numel) + j;
    double sum = 0.0;
    double magnitude = 0.0;
    for (int r = 0; r < world_size; ++r) {
      const float g = gradient_value(gradient_stream(o.seed, r, 0), position);
      sum += g;
      magnitude += std::fabs(g);
    }
    mismatches += !(std::fabs(dense_part[j] - sum * inv_n) <= 1e-6 * magnitude * inv_n + 1e-30);
  }
  return mismatches;
}

// Every rank's `unapplied` (one tensor) through the communicator: u32 indices then f32 values.
std::vector<Selection> gather_unapplied(comm::Communicator& comm, const Selection& mine,
                                        comm::Timeout timeout) {
  std::vector<uint8_t> bytes(8 * mine.indices.size());
  if (!mine.indices.empty()) {
    std::memcpy(bytes.data(), mine.indices.data(), 4 * mine.indices.size());
    std::memcpy(bytes.data() + 4 * mine.indices.size(), mine.values.data(), 4 * mine.values.size());
  }
  std::vector<Selection> all;
  for (const auto& m : comm.allgatherv(bytes, timeout)) {
    DGC_CHECK_EQ(m.size() % 8, size_t{0}, "unapplied message");
    Selection s;
    const size_t count = m.size() / 8;
    s.indices.resize(count);
    s.values.resize(count);
    if (count > 0) {
      std::memcpy(s.indices.data(), m.data(), 4 * count);
      std::memcpy(s.values.data(), m.data() + 4 * count, 4 * count);
    }
    all.push_back(std::move(s));
  }
  return all;
}

// Checks the dense allreduce result against the directly computed sum. Returns mismatches.
int64_t verify_dense(const BenchExchangeOptions& o, int world_size, std::span<const float> summed) {
  std::vector<uint64_t> streams(world_size);
  for (int r = 0; r < world_size; ++r) streams[r] = gradient_stream(o.seed, r, 0);
  int64_t mismatches = 0;
  for (size_t i = 0; i < summed.size(); ++i) {
    double sum = 0.0;
    double magnitude = 0.0;
    for (int r = 0; r < world_size; ++r) {
      const float g = gradient_value(streams[r], i);
      sum += g;
      magnitude += std::fabs(g);
    }
    mismatches += !(std::fabs(summed[i] - sum) <= 1e-6 * magnitude + 1e-30);
  }
  return mismatches;
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

std::string layout_description(const Result& r) {
  std::string text = "1 compressed tensor [" + std::to_string(r.numel) + "]";
  if (r.dense_numel > 0) text += " + 1 dense tensor [" + std::to_string(r.dense_numel) + "]";
  return text;
}

void print_result(const Result& r, const BenchExchangeOptions& o) {
  // With one rank nothing travels and both times are ~0: no speedup to report.
  const bool has_speedup = r.workers > 1 && r.dgc_seconds > 0 && r.dense_seconds > 0;
  const double speedup = has_speedup ? r.dense_seconds / r.dgc_seconds : 0.0;
  const double ratio =
      r.message_bytes > 0 ? static_cast<double>(r.dense_gradient_bytes) / r.message_bytes : 0.0;
  const double bytes_per_second = o.bandwidth_gbit * 1e9 / 8.0;
  if (o.json) {
    nlohmann::ordered_json j = {{"benchmark", "exchange"},
                                {"backend", r.backend},
                                {"launch", r.launch},
                                {"workers", r.workers},
                                {"numel", r.numel},
                                {"dense_numel", r.dense_numel},
                                {"layout", layout_description(r)},
                                {"density", r.density},
                                {"value_type", r.value_type},
                                {"exchange", r.exchange},
                                {"algorithm", r.algorithm},
                                {"selected_per_rank", r.selected_per_rank},
                                {"applied_per_iteration", r.applied},
                                {"returned_per_rank", r.returned_per_rank},
                                {"repeats", r.repeats},
                                {"dense_repeats", r.dense_repeats},
                                {"gradients", r.gradients},
                                {"select_seconds", r.select_seconds},
                                {"dgc_seconds", r.dgc_seconds},
                                {"dgc_seconds_min", r.dgc_seconds_min},
                                {"dense_seconds", r.dense_seconds},
                                {"dense_seconds_min", r.dense_seconds_min},
                                {"speedup", has_speedup ? nlohmann::ordered_json(speedup)
                                                        : nlohmann::ordered_json(nullptr)},
                                {"message_bytes", r.message_bytes},
                                {"dense_gradient_bytes", r.dense_gradient_bytes},
                                {"compression_ratio", ratio},
                                {"wire_bytes_sent_per_rank", r.wire_bytes_sent_per_rank},
                                {"wire_bytes_received_per_rank", r.wire_bytes_received_per_rank},
                                {"busiest_link_bytes", r.busiest_link_bytes},
                                {"dense_wire_bytes_per_rank", r.dense_wire_bytes_per_rank},
                                {"dense_busiest_link_bytes", r.dense_busiest_link_bytes},
                                {"verified", r.verified},
                                {"dense_verified", r.dense_verified}};
    j["phases"] = {{"encode_seconds", r.phases.encode},
                   {"collective_seconds", r.phases.collective},
                   {"validate_seconds", r.phases.validate},
                   {"decode_seconds", r.phases.decode}};
    if (o.bandwidth_gbit > 0) {
      j["bandwidth_gbit"] = o.bandwidth_gbit;
      j["wire_bound_seconds"] = r.busiest_link_bytes / bytes_per_second;
      j["dense_wire_bound_seconds"] = r.dense_busiest_link_bytes / bytes_per_second;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "dgc bench exchange: %s, %d ranks (%s), %s, density %g, values %s, exchange %s (%s)\n",
        r.backend.c_str(), r.workers, r.launch.c_str(), layout_description(r).c_str(), r.density,
        r.value_type.c_str(), r.exchange.c_str(), r.algorithm.c_str());
    std::printf("  selected per rank      %llu elements (selection %.4f s, not in the times)\n",
                static_cast<unsigned long long>(r.selected_per_rank), r.select_seconds);
    std::printf("  %-22s %12s %12s %14s %14s\n", "", "median s", "min s", "wire sent B",
                "busiest link B");
    std::printf("  %-22s %12.6f %12.6f %14llu %14llu\n", "DGC exchange", r.dgc_seconds,
                r.dgc_seconds_min, static_cast<unsigned long long>(r.wire_bytes_sent_per_rank),
                static_cast<unsigned long long>(r.busiest_link_bytes));
    std::printf("  %-22s %12.6f %12.6f %14llu %14llu\n", "dense allreduce", r.dense_seconds,
                r.dense_seconds_min, static_cast<unsigned long long>(r.dense_wire_bytes_per_rank),
                static_cast<unsigned long long>(r.dense_busiest_link_bytes));
    const std::string speedup_text =
        has_speedup ? detail::concat(std::round(speedup * 10) / 10, "x") : "n/a (one rank)";
    std::printf("  speedup %s; message %llu B vs dense gradient %llu B: compression ratio %.1fx\n",
                speedup_text.c_str(), static_cast<unsigned long long>(r.message_bytes),
                static_cast<unsigned long long>(r.dense_gradient_bytes), ratio);
    if (o.bandwidth_gbit > 0) {
      std::printf("  wire-time bound at %g Gbit/s: DGC %.6f s, dense %.6f s\n", o.bandwidth_gbit,
                  r.busiest_link_bytes / bytes_per_second,
                  r.dense_busiest_link_bytes / bytes_per_second);
    }
    std::printf(
        "  phases (median s, the Exchange's own timings): encode %.6f, collective %.6f, validate "
        "%.6f, decode %.6f\n",
        r.phases.encode, r.phases.collective, r.phases.validate, r.phases.decode);
    std::printf(
        "  applied %llu elements; handed back to a rank: up to %llu; "
        "wire received per rank %llu B\n",
        static_cast<unsigned long long>(r.applied),
        static_cast<unsigned long long>(r.returned_per_rank),
        static_cast<unsigned long long>(r.wire_bytes_received_per_rank));
    std::printf("  verified: DGC %s, dense %s (%lld mismatches over all ranks)%s%s\n",
                r.verified ? "yes" : "NO", r.dense_verified ? "yes" : "NO",
                static_cast<long long>(r.mismatches),
                r.first_problem.empty() ? "" : "; first: ", r.first_problem.c_str());
  }
  std::fflush(stdout);
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
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
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
      ->check(CLI::IsMember({"allgather", "direct", "sparse-allreduce", "auto"}))
      ->capture_default_str();
  cmd->callback([options] { run_bench_exchange(*options); });
}

}  // namespace dgc::cli
