// dgc bench compress: one DGC step on one large tensor, against baselines timed in the same run.
//
// What is measured (all on the same buffers, same process, same thread count):
//   - seconds: one full DGC step = Compressor::step (momentum correction, threshold selection,
//     momentum factor masking) plus encoding the selection into one wire message; the median
//     over `repeat` timed steps after two untimed ones;
//   - bandwidth_bound_seconds: one fused pass `u = m*u + g; v += u` over buffers of the same
//     size: the least any DGC step can cost, since it must read g, u, v and write u, v once;
//   - exact_topk_seconds: dgc::select_exact (nth_element over all magnitudes) of the same k on
//     the velocity left after the last step;
//   - state_copy_seconds: copying u and v aside (what a distributed step did before every step so
//     that it could roll back when another rank's gradient was not finite), and
//     staged_seconds: the same step as `seconds` through Compressor::stage() + commit() (the
//     step written into a second pair of buffers, then a swap: no copy) on a second compressor
//     fed the same gradients, whose selection is checked equal to the in-place one.
//     copy_and_step_seconds: the median of the per-step sums seconds + state_copy_seconds, the
//     compressor's part of a distributed step before staging; staged_saving_fraction =
//     1 - staged_seconds / copy_and_step_seconds.
// Gradients: a few pre-generated buffers of approximately normal values (sum of four uniforms),
// cycled, so the velocity evolves as in training. The message is validated once (untimed).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/commands.h"
#include "dgc/cli/statistics.h"
#include "dgc/core/codec.h"
#include "dgc/core/compressor.h"
#include "dgc/core/error.h"
#include "dgc/core/options.h"
#include "dgc/core/selection.h"
#include "dgc/core/thread_pool.h"

namespace dgc::cli {
namespace {

struct BenchCompressOptions {
  int64_t numel = 25'557'032;         // elements of the tensor (ResNet-50's parameter count)
  double density = 0.001;             // d
  int threads = 1;                    // CompressionOptions::threads (and the bound's threads)
  int repeat = 20;                    // timed steps (exact top-k: at most 3)
  int untimed_iterations = 5;         // untimed steps first (the threshold prediction settles)
  std::string value_type = "fp32";    // fp32 | fp16 | bf16
  std::string selection = "sampled";  // sampled | exact
  int gradients = 3;                  // pre-generated gradient buffers, cycled
  uint64_t seed = 1;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Approximately normal(0, 1) values: (sum of four uniforms in [0, 1) - 2) * sqrt(3).
void fill_gradient(std::vector<float>& out, uint64_t seed) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  constexpr float kUnit = 1.0f / 4294967296.0f;
  for (float& x : out) {
    const uint64_t a = next();
    const uint64_t b = next();
    const float sum =
        static_cast<float>(a & 0xFFFFFFFFu) * kUnit + static_cast<float>(a >> 32) * kUnit +
        static_cast<float>(b & 0xFFFFFFFFu) * kUnit + static_cast<float>(b >> 32) * kUnit;
    x = (sum - 2.0f) * 1.7320508f;
  }
}

// The bandwidth bound: u = m*u + g; v += u over [begin, end).
void fused_momentum(float* __restrict u, float* __restrict v, const float* __restrict g,
                    size_t begin, size_t end, float m) {
  for (size_t i = begin; i < end; ++i) {
    u[i] = m * u[i] + g[i];
    v[i] += u[i];
  }
}

void run_bench_compress(const BenchCompressOptions& o) {
  DGC_CHECK(o.numel > 0 && o.numel <= int64_t{UINT32_MAX}, "numel must be in [1, 2^32), got ",
            o.numel);
  check_density(o.density);
  DGC_CHECK_GE(o.threads, 1, "threads must be at least 1");
  DGC_CHECK_GE(o.repeat, 1, "repeat must be at least 1");
  DGC_CHECK_GE(o.untimed_iterations, 0, "untimed iterations must not be negative");
  DGC_CHECK_GE(o.gradients, 1, "gradients must be at least 1");
  const size_t n = static_cast<size_t>(o.numel);

  CompressionOptions options;
  options.threads = o.threads;
  options.value_type = parse_value_type(o.value_type);
  options.selection.method = parse_name(kSelectionMethodNames, o.selection, "--selection");
  options.seed = o.seed;
  Compressor compressor({o.numel}, options);
  Compressor staged({o.numel}, options);
  std::vector<float> saved_u(n), saved_v(n);
  const float m = static_cast<float>(options.momentum.factor);

  std::vector<std::vector<float>> grads(static_cast<size_t>(o.gradients), std::vector<float>(n));
  for (size_t i = 0; i < grads.size(); ++i) fill_gradient(grads[i], o.seed * 1000 + i);
  std::vector<float> bound_u(n, 0.0f), bound_v(n, 0.0f);

  ThreadPool pool(o.threads);
  const size_t parts = static_cast<size_t>(o.threads);
  auto bound_pass = [&](const std::vector<float>& g) {
    pool.run(parts, [&](size_t part) {
      fused_momentum(bound_u.data(), bound_v.data(), g.data(), part * n / parts,
                     (part + 1) * n / parts, m);
    });
  };

  Selection selection;
  MessageWriter writer(options.value_type, 0);
  std::vector<uint8_t> message;
  auto dgc_step = [&](int iteration) {
    compressor.step(0, grads[static_cast<size_t>(iteration) % grads.size()], o.density, selection);
    writer.reset(options.value_type, static_cast<uint64_t>(iteration));
    writer.add(0, n, selection.indices, selection.values);
    writer.finish(message);
  };

  Selection staged_selection;
  auto staged_step = [&](int iteration) {
    staged.stage(0, grads[static_cast<size_t>(iteration) % grads.size()], o.density,
                 staged_selection);
    staged.commit();
  };
  auto copy_state = [&] {
    const auto u = compressor.momentum(0);
    const auto v = compressor.velocity(0);
    std::copy(u.begin(), u.end(), saved_u.begin());
    std::copy(v.begin(), v.end(), saved_v.begin());
  };

  const int untimed = o.untimed_iterations;
  for (int i = 0; i < untimed; ++i) {
    dgc_step(i);
    staged_step(i);
    copy_state();
    bound_pass(grads[static_cast<size_t>(i) % grads.size()]);
  }
  std::vector<double> step_times, bound_times, copy_times, staged_times, copy_and_step_times;
  size_t selected_total = 0, bytes_total = 0;
  int rounds_total = 0, hierarchical_steps = 0;
  for (int r = 0; r < o.repeat; ++r) {
    const int iteration = untimed + r;
    auto start = Clock::now();
    dgc_step(iteration);
    step_times.push_back(seconds_since(start));
    selected_total += selection.indices.size();
    bytes_total += message.size();
    rounds_total += selection.rounds;
    hierarchical_steps += selection.hierarchical;

    start = Clock::now();
    staged_step(iteration);
    staged_times.push_back(seconds_since(start));
    if (staged_selection.indices != selection.indices ||
        staged_selection.values != selection.values) {
      throw Error("bench compress: the staged step selected other elements than the in-place one");
    }

    start = Clock::now();
    copy_state();
    copy_times.push_back(seconds_since(start));
    copy_and_step_times.push_back(step_times.back() + copy_times.back());

    start = Clock::now();
    bound_pass(grads[static_cast<size_t>(iteration) % grads.size()]);
    bound_times.push_back(seconds_since(start));
  }

  // Sanity check, untimed: the last message decodes to exactly the last selection.
  const uint64_t expected_numel = n;
  size_t decoded = 0;
  decode_message(message, std::span<const uint64_t>(&expected_numel, 1),
                 [&](uint32_t, uint64_t index, float value) {
                   if (decoded >= selection.indices.size() || index != selection.indices[decoded] ||
                       value != selection.values[decoded]) {
                     throw Error("bench compress: decoded message differs from the selection");
                   }
                   ++decoded;
                 });
  DGC_CHECK_EQ(decoded, selection.indices.size(), "decoded element count");

  const size_t k = target_count(n, o.density);
  std::vector<double> exact_times;
  Selection exact;
  for (int r = 0; r < std::min(o.repeat, 3); ++r) {
    const auto start = Clock::now();
    select_exact(compressor.velocity(0), k, exact);
    exact_times.push_back(seconds_since(start));
  }

  const double seconds = median(step_times);
  const double bound = median(bound_times);
  const double selected = static_cast<double>(selected_total) / o.repeat;
  const double encoded = static_cast<double>(bytes_total) / o.repeat;
  nlohmann::ordered_json result = {
      {"benchmark", "compress"},
      {"numel", o.numel},
      {"density", o.density},
      {"threads", o.threads},
      {"value_type", o.value_type},
      {"selection", o.selection},
      {"repeat", o.repeat},
      {"untimed_iterations", o.untimed_iterations},
      {"seconds", seconds},
      {"bandwidth_bound_seconds", bound},
      {"exact_topk_seconds", median(exact_times)},
      {"staged_seconds", median(staged_times)},
      {"state_copy_seconds", median(copy_times)},
      {"copy_and_step_seconds", median(copy_and_step_times)},
      {"staged_ratio_to_in_place", median(staged_times) / seconds},
      {"state_copy_fraction_of_step", median(copy_times) / seconds},
      {"staged_saving_fraction", 1.0 - median(staged_times) / median(copy_and_step_times)},
      {"ratio_to_bound", seconds / bound},
      {"exact_topk_ratio_to_bound", median(exact_times) / bound},
      {"k", k},
      {"selected", selected},
      {"encoded_bytes", encoded},
      {"bytes_per_selected", selected > 0 ? encoded / selected : 0.0},
      {"dense_gradient_bytes", 4 * n},
      {"compression_ratio", encoded > 0 ? 4.0 * static_cast<double>(n) / encoded : 0.0},
      {"threshold_rounds_per_step", static_cast<double>(rounds_total) / o.repeat},
      {"hierarchical_steps", hierarchical_steps},
      {"bandwidth_bound_gbytes_per_second", 20.0 * static_cast<double>(n) / bound / 1e9},
  };
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::printf("dgc bench compress: one DGC step vs its bandwidth bound (medians)\n");
    for (const auto& [key, value] : result.items()) {
      if (key == "benchmark") continue;
      std::printf("  %-34s %s\n", key.c_str(), value.dump().c_str());
    }
  }
  std::fflush(stdout);
}

}  // namespace

void add_bench_compress(CLI::App& bench) {
  auto options = std::make_shared<BenchCompressOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "compress",
      "One DGC step (momentum correction, selection, masking, encoding) on one tensor, against "
      "a fused momentum pass (bandwidth bound) and an exact top-k, timed in the same run");
  cmd->add_option("--numel", options->numel, "Elements of the tensor (ResNet-50: 25557032)")
      ->capture_default_str();
  cmd->add_option("--density", options->density, "Density d: fraction of elements sent")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "Threads for the tensor")->capture_default_str();
  cmd->add_option("--repeat", options->repeat, "Timed steps (medians reported)")
      ->capture_default_str();
  cmd->add_option("--value-type", options->value_type, "Wire type of the values")
      ->check(CLI::IsMember(names_of(kValueTypeNames)))
      ->capture_default_str();
  cmd->add_option("--selection", options->selection, "Threshold selection method")
      ->check(CLI::IsMember(names_of(kSelectionMethodNames)))
      ->capture_default_str();
  cmd->add_option("--untimed-iterations", options->untimed_iterations,
                  "Untimed steps before the timed ones")
      ->capture_default_str();
  cmd->add_option("--gradients", options->gradients, "Pre-generated gradient buffers, cycled")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seeds the gradients and the sampling")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print one JSON object per line");
  cmd->callback([options] { run_bench_compress(*options); });
}

}  // namespace dgc::cli
