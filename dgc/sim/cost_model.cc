#include "dgc/sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "dgc/core/error.h"
#include "dgc/core/policy.h"
#include "dgc/core/selection.h"

namespace dgc::sim {
namespace {

const std::map<std::string, Link>& platforms() {
  // bench/platforms/*.xml: per-link rate and latency; host to host crosses two links.
  static const std::map<std::string, Link> links = {
      {"ethernet-100m", {100e6, 2 * 50e-6}}, {"ethernet-1g", {1e9, 2 * 25e-6}},
      {"ethernet-10g", {10e9, 2 * 10e-6}},   {"mobile", {20e6, 2 * 10e-3}},
      {"mobile-lossy", {11e6, 2 * 10e-3}},   {"racks-1g", {1e9, 2 * 25e-6}},
      {"racks-10g", {10e9, 2 * 10e-6}},
  };
  return links;
}

double bytes_per_second(const Link& link) { return kWireEfficiency * link.bits_per_second / 8.0; }

}  // namespace

Link platform_link(const std::string& name) {
  const auto it = platforms().find(name);
  if (it == platforms().end()) {
    std::string known;
    for (const auto& [n, l] : platforms()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("unknown platform '" + name + "' (known: " + known +
                          "); or give the link as a rate and latency");
  }
  return it->second;
}

const std::vector<std::string>& platform_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [n, l] : platforms()) out.push_back(n);
    return out;
  }();
  return names;
}

std::string rate_text(double bits_per_second) {
  char text[64];
  if (bits_per_second >= 1e9) {
    std::snprintf(text, sizeof text, "%g Gbit/s", bits_per_second / 1e9);
  } else {
    std::snprintf(text, sizeof text, "%g Mbit/s", bits_per_second / 1e6);
  }
  return text;
}

ModelSize model_size(const std::vector<train::NamedShape>& shapes, double density) {
  ModelSize m;
  const PolicyOptions policy;
  for (const auto& [name, shape] : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    m.parameters += numel;
    if (choose_path(shape, policy) == TensorPath::kCompressed) {
      m.compressed += numel;
      m.selected += static_cast<int64_t>(target_count(static_cast<size_t>(numel), density));
    } else {
      m.dense_path += numel;
    }
  }
  return m;
}

const CostConstants& fitted_constants() {
  // Fitted by `dgc plan --fit docs/data/sim-scaling.jsonl` to the 105 dgc-sim runs of
  // docs/scaling.md (ResNet-50 and AlexNet, 1-64 nodes, 100 Mbit/s to 10 Gbit/s and mobile);
  // medians of the per-element figures. CPU times are one core of the 2-core machine.
  static const CostConstants c = {
      .allreduce_factor = 1.05,
      .compress_per_element = 9.051e-10,
      .update_per_element = 3.53e-10,
      .bytes_per_element = 6.014,
      .decode_per_element = 9.37e-08,
      .sparse_volume = 1.647,
      .sparse_cpu_per_element = 1.248e-07,
  };
  return c;
}

double dense_allreduce_seconds(int64_t elements, int nodes, const Link& link,
                               const CostConstants& c) {
  if (nodes <= 1 || elements <= 0) return 0.0;
  const double n = nodes;
  return c.allreduce_factor *
         (2.0 * (n - 1.0) / n * 4.0 * double(elements) / bytes_per_second(link) +
          2.0 * (n - 1.0) * link.latency_seconds);
}

double exchange_seconds(const ModelSize& model, int nodes, const Link& link,
                        ExchangeAlgorithm algorithm, const CostConstants& c) {
  if (nodes <= 1) return 0.0;
  const double n = nodes, k = double(model.selected), b = bytes_per_second(link);
  const double message = c.bytes_per_element * k;
  const double dense_path = dense_allreduce_seconds(model.dense_path, nodes, link, c);
  switch (algorithm) {
    case ExchangeAlgorithm::kAllgather:
      return dense_path + (n - 1.0) * message / b + (n - 1.0) * link.latency_seconds +
             c.decode_per_element * (n - 1.0) * k;
    case ExchangeAlgorithm::kDirect:
      return dense_path + (n - 1.0) * message / b + 2.0 * link.latency_seconds +
             c.decode_per_element * (n - 1.0) * k;
    case ExchangeAlgorithm::kSparseAllreduce:
      return dense_path + c.sparse_volume * message / b + 4.0 * link.latency_seconds +
             c.sparse_cpu_per_element * k * std::log2(n);
    case ExchangeAlgorithm::kAuto:
      break;
  }
  throw InvalidArgument("exchange_seconds: a concrete algorithm is needed, not auto");
}

double Prediction::best_dgc() const { return *std::min_element(dgc.begin(), dgc.end()); }

Prediction predict(const ModelSize& model, int nodes, const Link& link, double compute_seconds,
                   const CostConstants& c) {
  DGC_CHECK(nodes >= 1, "nodes must be at least 1, got ", nodes);
  DGC_CHECK(link.bits_per_second > 0 && link.latency_seconds >= 0,
            "the link needs a positive rate and a latency >= 0");
  Prediction p;
  const double update = c.update_per_element * double(model.parameters);
  p.single_node = compute_seconds + update;
  p.dense = p.single_node + dense_allreduce_seconds(model.parameters, nodes, link, c);
  const double compress = c.compress_per_element * double(model.compressed);
  for (size_t i = 0; i < kPlannedAlgorithms.size(); ++i) {
    p.dgc[i] =
        p.single_node + compress + exchange_seconds(model, nodes, link, kPlannedAlgorithms[i], c);
  }
  size_t best = 0;
  for (size_t i = 1; i < p.dgc.size(); ++i) {
    if (p.dgc[i] < p.dgc[best]) best = i;
  }
  p.best = kPlannedAlgorithms[best];
  return p;
}

}  // namespace dgc::sim
