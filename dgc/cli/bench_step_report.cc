// dgc bench step's report (bench_step.h).
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "dgc/cli/bench_step.h"

namespace dgc::cli::bench_step {
namespace {

// The bound of the target: max(compute, the one-message step's own work and exchange).
double bound(double compute, const Measured& one_message) {
  return std::max(compute, one_message.compress + one_message.exchange + one_message.update);
}

void add_replay(nlohmann::ordered_json& j, const Row& r) {
  const Measured& dense1 = *r.dense_one_message;
  const Measured& dgc1 = *r.dgc_one_message;
  j["replay"] = "backward order, compute in proportion to forward FLOPs";
  j["buckets_dense"] = r.dense.buckets;
  j["buckets_dgc"] = r.dgc.buckets;
  j["step_seconds_dense_one_message"] = dense1.step;
  j["step_seconds_dgc_one_message"] = dgc1.step;
  j["dgc_exposed_seconds"] = r.dgc.step - r.compute;
  j["dgc_wait_seconds"] = r.dgc.wait;
  j["dense_exposed_seconds"] = r.dense.step - r.compute;
  j["dgc_one_message_work_seconds"] = dgc1.compress + dgc1.update;
  j["dgc_one_message_exchange_seconds"] = dgc1.exchange;
  j["dense_one_message_work_seconds"] = dense1.compress + dense1.update;
  j["dense_one_message_exchange_seconds"] = dense1.exchange;
  j["dgc_bound_seconds"] = bound(r.compute, dgc1);
  j["dense_bound_seconds"] = bound(r.compute, dense1);
  j["dgc_step_over_bound"] = r.dgc.step / bound(r.compute, dgc1);
  j["dense_step_over_bound"] = r.dense.step / bound(r.compute, dense1);
}

void print_replay(const Row& r) {
  const Measured& dense1 = *r.dense_one_message;
  const Measured& dgc1 = *r.dgc_one_message;
  std::printf(
      "  replayed backward pass (compute in proportion to forward FLOPs), buckets: dense %zu, "
      "DGC %zu\n",
      r.dense.buckets, r.dgc.buckets);
  std::printf("  one message after backward: dense %.4f s, DGC %.4f s\n", dense1.step, dgc1.step);
  std::printf(
      "  DGC: compute %.4f s, own work %.4f s, exchange %.4f s (one message); overlapped step "
      "%.4f s = %.2fx max(compute, work + exchange), exposed %.4f s\n",
      r.compute, dgc1.compress + dgc1.update, dgc1.exchange, r.dgc.step,
      r.dgc.step / bound(r.compute, dgc1), r.dgc.step - r.compute);
  std::printf(
      "  dense: own work %.4f s, exchange %.4f s (one message); overlapped step %.4f s = %.2fx "
      "max(compute, work + exchange), exposed %.4f s\n",
      dense1.compress + dense1.update, dense1.exchange, r.dense.step,
      r.dense.step / bound(r.compute, dense1), r.dense.step - r.compute);
}

}  // namespace

void print(const Row& r, const BenchStepOptions& o) {
  // With replay the measured step holds the compute.
  const double dense_step = (o.replay ? 0.0 : r.compute) + r.dense.step;
  const double dgc_step = (o.replay ? 0.0 : r.compute) + r.dgc.step;
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
    };
    if (r.dgc.bound > 0 && r.dense.bound > 0) {
      j["dgc_own_seconds"] = dgc_own;
      j["core_step_seconds"] = r.dgc.bound;
      j["dgc_own_ratio_to_core_step"] = dgc_own / r.dgc.bound;
      j["dense_bound_seconds"] = r.dense.bound;
      j["dense_own_ratio_to_bound"] = dense_own / r.dense.bound;
    }
    if (o.replay) add_replay(j, r);
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
    if (r.dgc.bound > 0 && r.dense.bound > 0) {
      std::printf(
          "  own work (compress + update): DGC %.4f s = %.2fx the core's fused step on the same "
          "elements (%.4f s); dense %.4f s = %.2fx its streaming bound (%.4f s)\n",
          dgc_own, dgc_own / r.dgc.bound, r.dgc.bound, dense_own, dense_own / r.dense.bound,
          r.dense.bound);
    }
    if (eff_dense && eff_dgc) {
      std::printf("  scaling efficiency: dense %.3f, DGC %.3f\n", *eff_dense, *eff_dgc);
    }
    if (o.replay) print_replay(r);
  }
  std::fflush(stdout);
}

}  // namespace dgc::cli::bench_step
