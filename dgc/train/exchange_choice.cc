#include "dgc/train/exchange_choice.h"

#include <charconv>
#include <cstdio>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

bool parse_number(const std::string& text, double& value) {
  const char* end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, value);
  return result.ec == std::errc() && result.ptr == end;
}

}  // namespace

sim::Link parse_link(const std::string& text) {
  for (const auto& name : sim::platform_names()) {
    if (name == text) return sim::platform_link(name);
  }
  const auto colon = text.find(':');
  double mbit = 0.0;
  double latency_ms = 0.05;
  const bool ok = parse_number(text.substr(0, colon), mbit) && mbit > 0 &&
                  (colon == std::string::npos ||
                   (parse_number(text.substr(colon + 1), latency_ms) && latency_ms >= 0));
  if (!ok) {
    std::string names;
    for (const auto& name : sim::platform_names()) names += (names.empty() ? "" : ", ") + name;
    throw InvalidArgument("--link '" + text + "': give a platform (" + names +
                          ") or RATE_MBIT[:LATENCY_MS], e.g. 1000:0.05 (one way, host to host)");
  }
  return sim::Link{mbit * 1e6, latency_ms / 1e3};
}

ExchangeChoice choose_exchange_for_link(const std::vector<NamedShape>& shapes, int workers,
                                        double density, const sim::Link& link) {
  DGC_CHECK_GE(workers, 1, "workers");
  const sim::ModelSize model = sim::model_size(shapes, density);
  ExchangeChoice choice;
  size_t best = 0;
  for (size_t a = 0; a < sim::kPlannedAlgorithms.size(); ++a) {
    choice.seconds[a] = sim::exchange_seconds(model, workers, link, sim::kPlannedAlgorithms[a],
                                              sim::fitted_constants());
    if (choice.seconds[a] < choice.seconds[best]) best = a;
  }
  choice.algorithm = sim::kPlannedAlgorithms[best];
  char line[320];
  std::snprintf(line, sizeof line,
                "exchange auto: %s for %d workers at %s, %.3g ms: predicted allgather %.3g ms, "
                "direct %.3g ms, sparse-allreduce %.3g ms (dgc plan's cost model)",
                to_string(choice.algorithm), workers, sim::rate_text(link.bits_per_second).c_str(),
                link.latency_seconds * 1e3, choice.seconds[0] * 1e3, choice.seconds[1] * 1e3,
                choice.seconds[2] * 1e3);
  choice.text = line;
  return choice;
}

}  // namespace dgc::train
