// dgc bench exchange's report (bench_exchange.h): a table, or one JSON object per line.
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "dgc/cli/bench_exchange.h"
#include "dgc/core/error.h"

namespace dgc::cli::bench_exchange {
namespace {

std::string layout_description(const Result& r) {
  std::string text = "1 compressed tensor [" + std::to_string(r.numel) + "]";
  if (r.dense_numel > 0) text += " + 1 dense tensor [" + std::to_string(r.dense_numel) + "]";
  return text;
}

}  // namespace

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

}  // namespace dgc::cli::bench_exchange
