// dgc bench auth: what the job secret costs per step: HMAC-SHA256 tags on the exchange messages
// of a model's gradient, against the same step without a secret, in the same process.
//
// The gradient: the model's parameter shapes (dgc/train/model_shapes.h; default `cnn`, the
// default model of `dgc train`) split by the default policy into compressed and dense-path
// tensors. With --dense-path grouped (dgc train's default) the dense-path tensors travel as one
// more compressed tensor at --dense-path-density (0.1, dgc train's default), inside the message;
// with exact they are averaged (an allreduce, or a tagged allgatherv with a key). Every rank
// selects k = ceil(density * numel) distinct random positions of every compressed tensor
// (random values), a pure function of (seed, rank, iteration).
//
// Two measurements:
//   1. the operations alone, on one thread, in CPU time (CLOCK_THREAD_CPUTIME_ID, so other
//      processes' load does not count): tagging one rank's message, and validating the N
//      messages of one step with and without tag verification (ValidatedMessage::validate with
//      and without an expectation that has a key), the dense-path buffer likewise; `repeats`
//      rounds, the median;
//   2. the whole exchange, N ranks as threads over Gloo (loopback): Exchange::run with and
//      without a key, alternating step by step (each first every other step) so that both see
//      the same load; per step rank 0's wall time of the run and of its encode and validate
//      phases (Exchange::last_timings), the median. On a loaded machine the wall times scatter
//      far more than the tags cost: read them against part 1. With a key the dense path travels
//      as a tagged allgatherv instead of an allreduce (exchange.h): that is part of the cost and
//      is included.
// Bytes: the message with and without its tag, and the tag's fraction of it.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/commands.h"
#include "dgc/comm/launch.h"
#include "dgc/core/auth.h"
#include "dgc/core/codec.h"
#include "dgc/core/error.h"
#include "dgc/core/policy.h"
#include "dgc/exchange/exchange.h"
#include "dgc/train/model_shapes.h"

namespace dgc::cli {
namespace {

struct BenchAuthOptions {
  std::string model = "cnn";
  int workers = 4;
  double density = 0.001;
  std::string dense_path = "grouped";  // grouped | exact
  double dense_path_density = 0.1;
  int repeats = 200;  // rounds of the single-thread measurement
  int steps = 60;     // exchange steps of each kind (with and without a key)
  uint64_t seed = 1;
  bool json = false;
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Rank `rank`'s selections at `iteration`, one per compressed tensor of `layout`.
// The last compressed tensor is the dense-path group when `group_density` > 0.
std::vector<Selection> selections_for(const std::vector<TensorSpec>& layout,
                                      const std::vector<size_t>& compressed, double density,
                                      uint64_t seed, int rank, uint64_t iteration,
                                      double group_density = 0.0) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(rank) * 7919 + iteration);
  std::vector<Selection> out;
  for (size_t c : compressed) {
    const auto numel = static_cast<uint64_t>(layout[c].numel());
    const double d = group_density > 0 && c == compressed.back() ? group_density : density;
    const auto k = static_cast<size_t>(std::ceil(d * static_cast<double>(numel)));
    std::vector<uint32_t> all(numel);
    for (uint64_t i = 0; i < numel; ++i) all[i] = static_cast<uint32_t>(i);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min<size_t>(k, all.size()));
    std::sort(all.begin(), all.end());
    Selection s;
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (uint32_t i : all) {
      s.indices.push_back(i);
      s.values.push_back(value(rng));
    }
    out.push_back(std::move(s));
  }
  return out;
}

void run_bench_auth(const BenchAuthOptions& o) {
  DGC_CHECK(o.workers >= 1, "--workers must be >= 1");
  DGC_CHECK(o.repeats >= 1 && o.steps >= 1, "--repeats and --steps must be >= 1");
  DGC_CHECK(o.dense_path == "grouped" || o.dense_path == "exact",
            "--dense-path must be grouped or exact, got ", o.dense_path);
  auto layout = make_layout(train::model_shapes(o.model), PolicyOptions{});
  const bool grouped = o.dense_path == "grouped";
  if (grouped) {
    // As dgc train's grouped dense path: the compressed tensors, then one group of the rest.
    std::vector<TensorSpec> regrouped;
    int64_t group = 0;
    for (const auto& t : layout) {
      if (t.path == TensorPath::kCompressed) {
        regrouped.push_back(t);
      } else {
        group += t.numel();
      }
    }
    if (group > 0) regrouped.push_back({"dense-path group", {group}, TensorPath::kCompressed});
    layout = std::move(regrouped);
  }
  const double group_density = grouped ? o.dense_path_density : 0.0;
  std::vector<size_t> compressed;
  std::vector<uint64_t> numels;
  uint64_t dense_numel = 0, parameters = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    parameters += static_cast<uint64_t>(layout[t].numel());
    if (layout[t].path == TensorPath::kCompressed) {
      compressed.push_back(t);
      numels.push_back(static_cast<uint64_t>(layout[t].numel()));
    } else {
      dense_numel += static_cast<uint64_t>(layout[t].numel());
    }
  }
  const int n = o.workers;
  MacKey key{};
  std::mt19937_64 key_rng(o.seed);
  for (auto& b : key) b = static_cast<uint8_t>(key_rng());
  const MessageAuthenticator auth(key);
  RunId run_id{};
  run_id[0] = 1;

  // 1. The operations alone, one thread, CPU time.
  std::vector<std::vector<uint8_t>> plain(n), tagged(n);
  for (int r = 0; r < n; ++r) {
    const auto sel = selections_for(layout, compressed, o.density, o.seed, r, 0, group_density);
    MessageWriter writer(ValueType::kFloat32, 0, run_id);
    for (size_t i = 0; i < sel.size(); ++i) {
      writer.add(static_cast<uint32_t>(i), numels[i], sel[i].indices, sel[i].values);
    }
    writer.finish(plain[r]);
    writer.finish(tagged[r], auth, {static_cast<uint32_t>(r), kEveryRank});
  }
  std::vector<uint8_t> dense_path_payload(4 * dense_numel, 0x3c);
  std::vector<double> tag_one, validate_plain, validate_tagged, dense_tag, dense_verify;
  volatile uint8_t sink = 0;
  const bool dense = dense_numel > 0;
  for (int rep = 0; rep < o.repeats; ++rep) {
    double t0 = thread_cpu_seconds();
    const uint8_t route[8] = {0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF};
    const Tag t = auth.tag({route, std::span<const uint8_t>(plain[0])});
    double t1 = thread_cpu_seconds();
    tag_one.push_back(t1 - t0);
    sink = static_cast<uint8_t>(sink ^ t[0]);  // the tag is used

    t0 = thread_cpu_seconds();
    for (int r = 0; r < n; ++r) ValidatedMessage::validate(plain[r], numels);
    t1 = thread_cpu_seconds();
    validate_plain.push_back(t1 - t0);

    MessageExpectation expect{run_id, 0, &auth, {}};
    t0 = thread_cpu_seconds();
    for (int r = 0; r < n; ++r) {
      expect.route = {static_cast<uint32_t>(r), kEveryRank};
      ValidatedMessage::validate(tagged[r], numels, &expect);
    }
    t1 = thread_cpu_seconds();
    validate_tagged.push_back(t1 - t0);

    if (!dense) continue;
    t0 = thread_cpu_seconds();
    const Tag d = auth.tag({route, std::span<const uint8_t>(dense_path_payload)});
    t1 = thread_cpu_seconds();
    dense_tag.push_back(t1 - t0);
    t0 = thread_cpu_seconds();
    bool ok = true;
    for (int r = 0; r < n; ++r)
      ok = auth.verify({route, std::span<const uint8_t>(dense_path_payload)}, d) && ok;
    t1 = thread_cpu_seconds();
    DGC_CHECK(ok, "the dense tag did not verify");
    dense_verify.push_back(t1 - t0);
  }
  const double us = 1e6;
  const double tag_us = us * median(tag_one);
  const double plain_us = us * median(validate_plain);
  const double tagged_us = us * median(validate_tagged);
  const double dense_tag_us = us * median(dense_tag);
  const double dense_verify_us = us * median(dense_verify);
  const double hmac_per_step_us = tag_us + (tagged_us - plain_us) + dense_tag_us + dense_verify_us;

  // 2. The exchange, N ranks as threads, with and without a key, alternating.
  std::vector<double> wall_plain, wall_keyed, ev_plain, ev_keyed;
  uint64_t message_plain = 0, message_keyed = 0;
  comm::GlooOptions gloo;
  gloo.timeout = std::chrono::milliseconds(120000);
  comm::run_local(n, gloo, [&](comm::Communicator& comm) {
    ExchangeOptions options;
    options.timeout = gloo.timeout;
    options.settings = "bench=auth\n";
    Exchange without(comm, layout, options);
    options.message_key = key;
    Exchange with(comm, layout, options);
    std::vector<std::vector<float>> updates_a, updates_b;
    for (uint64_t numel : numels) {
      updates_a.emplace_back(numel);
      updates_b.emplace_back(numel);
    }
    std::vector<std::span<float>> spans_a(updates_a.begin(), updates_a.end());
    std::vector<std::span<float>> spans_b(updates_b.begin(), updates_b.end());
    std::vector<float> dense_buffer(dense_numel);
    const int untimed_steps = 3;
    for (int s = 0; s < o.steps + untimed_steps; ++s) {
      const auto sel = selections_for(layout, compressed, o.density, o.seed, comm.rank(),
                                      static_cast<uint64_t>(s % 8), group_density);
      for (int k = 0; k < 2; ++k) {
        const int keyed = s % 2 == 0 ? k : 1 - k;  // each goes first every other step
        Exchange& exchange = keyed ? with : without;
        std::fill(dense_buffer.begin(), dense_buffer.end(), 0.5f);
        comm.barrier(gloo.timeout);
        const auto start = std::chrono::steady_clock::now();
        exchange.run(static_cast<uint64_t>(s), sel, keyed ? spans_b : spans_a, dense_buffer);
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (comm.rank() != 0 || s < untimed_steps) continue;
        const auto& t = exchange.last_timings();
        (keyed ? wall_keyed : wall_plain).push_back(wall);
        (keyed ? ev_keyed : ev_plain).push_back(t.encode + t.validate);
        (keyed ? message_keyed : message_plain) = exchange.last().message;
      }
    }
  });
  const double wall_plain_us = us * median(wall_plain), wall_keyed_us = us * median(wall_keyed);
  const double ev_plain_us = us * median(ev_plain), ev_keyed_us = us * median(ev_keyed);
  const double message_bytes = static_cast<double>(plain[0].size());
  const double dense_path_bytes = 4.0 * static_cast<double>(dense_numel);

  if (o.json) {
    nlohmann::json j;
    j["bench"] = "auth";
    j["model"] = o.model;
    j["workers"] = n;
    j["density"] = o.density;
    j["dense_path"] = o.dense_path;
    j["parameters"] = parameters;
    j["message_bytes"] = plain[0].size();
    j["tagged_message_bytes"] = tagged[0].size();
    j["dense_path_bytes"] = 4 * dense_numel;
    j["tag_message_cpu_us"] = tag_us;
    j["validate_n_cpu_us"] = plain_us;
    j["validate_n_verified_cpu_us"] = tagged_us;
    j["tag_dense_cpu_us"] = dense_tag_us;
    j["verify_dense_n_cpu_us"] = dense_verify_us;
    j["hmac_per_step_cpu_us"] = hmac_per_step_us;
    j["exchange_wall_us"] = wall_plain_us;
    j["exchange_keyed_wall_us"] = wall_keyed_us;
    j["encode_validate_us"] = ev_plain_us;
    j["encode_validate_keyed_us"] = ev_keyed_us;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "dgc bench auth: model %s (%llu parameters; %zu compressed tensors%s, %llu elements "
      "averaged dense), density %g, dense path %s, %d ranks\n",
      o.model.c_str(), static_cast<unsigned long long>(parameters), compressed.size(),
      grouped ? " incl. the dense-path group" : "", static_cast<unsigned long long>(dense_numel),
      o.density, o.dense_path.c_str(), n);
  std::printf("  bytes per rank and step: message %.0f B + tag 32 B (%.2f%% more)", message_bytes,
              100.0 * 32.0 / message_bytes);
  if (dense) {
    std::printf("; dense path %.0f B + tag 32 B (%.2f%%)", dense_path_bytes,
                100.0 * 32.0 / dense_path_bytes);
  }
  std::printf("\n");
  std::printf("  1. HMAC-SHA256 alone, one thread, CPU time (median of %d):\n", o.repeats);
  std::printf("     tag this rank's message                  %8.2f us\n", tag_us);
  std::printf("     validate %d messages without / with tags  %8.2f / %.2f us (+%.2f us)\n", n,
              plain_us, tagged_us, tagged_us - plain_us);
  if (dense) {
    std::printf("     tag / verify %d dense-path buffers        %8.2f / %.2f us\n", n, dense_tag_us,
                dense_verify_us);
  }
  std::printf("     HMAC cost per step and rank              %8.2f us\n", hmac_per_step_us);
  std::printf(
      "  2. Exchange::run, %d ranks as threads over loopback, rank 0 wall time (median of %d "
      "steps each, alternating):\n",
      n, o.steps);
  std::printf("     without a key: %8.1f us per step (encode + validate %.1f us)\n", wall_plain_us,
              ev_plain_us);
  std::printf("     with a key:    %8.1f us per step (encode + validate %.1f us): x%.2f\n",
              wall_keyed_us, ev_keyed_us, wall_plain_us > 0 ? wall_keyed_us / wall_plain_us : 0);
  std::printf("     message bytes per step (all messages of this rank): %llu without, %llu with\n",
              static_cast<unsigned long long>(message_plain),
              static_cast<unsigned long long>(message_keyed));
}

}  // namespace

void add_bench_auth(CLI::App& bench) {
  auto options = std::make_shared<BenchAuthOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "auth",
      "Cost per step of the job secret's HMAC-SHA256 tags on a model's gradient, with the same "
      "step without a secret as baseline");
  cmd->add_option("--model", options->model,
                  "Parameter shapes: cnn (dgc train's default), "
                  "resnet50, alexnet, vgg16, lstm-ptb")
      ->capture_default_str();
  cmd->add_option("--workers", options->workers, "Ranks (threads) of the exchange measurement")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--density", options->density, "Fraction of each compressed tensor selected")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  cmd->add_option("--dense-path", options->dense_path,
                  "grouped (dgc train's default: the dense-path tensors as one more compressed "
                  "tensor) or exact (averaged: allreduce, or tagged allgatherv with a key)")
      ->check(CLI::IsMember({"grouped", "exact"}))
      ->capture_default_str();
  cmd->add_option("--dense-path-density", options->dense_path_density,
                  "Density of the dense-path group (grouped)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  cmd->add_option("--repeats", options->repeats, "Rounds of the single-thread measurement")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--steps", options->steps, "Exchange steps of each kind (timed)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seeds the selections and the key")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print one JSON object instead of the table");
  cmd->callback([options] { run_bench_auth(*options); });
}

}  // namespace dgc::cli
