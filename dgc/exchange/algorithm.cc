#include "dgc/exchange/algorithm.h"

#include <cmath>

#include "dgc/core/error.h"
#include "dgc/core/selection.h"

namespace dgc {

ExchangeAlgorithm parse_exchange_algorithm(const std::string& name) {
  if (name == "allgather") return ExchangeAlgorithm::kAllgather;
  if (name == "direct") return ExchangeAlgorithm::kDirect;
  if (name == "sparse-allreduce") return ExchangeAlgorithm::kSparseAllreduce;
  if (name == "auto") return ExchangeAlgorithm::kAuto;
  throw InvalidArgument("unknown exchange algorithm '" + name +
                        "': expected allgather, direct, sparse-allreduce or auto");
}

const char* to_string(ExchangeAlgorithm algorithm) {
  switch (algorithm) {
    case ExchangeAlgorithm::kAllgather:
      return "allgather";
    case ExchangeAlgorithm::kDirect:
      return "direct";
    case ExchangeAlgorithm::kSparseAllreduce:
      return "sparse-allreduce";
    case ExchangeAlgorithm::kAuto:
      return "auto";
  }
  return "unknown";
}

ExchangeAlgorithm choose_algorithm(int world_size, double density, uint64_t numel) {
  DGC_CHECK_GE(world_size, 1, "world size");
  check_density(density);
  if (world_size == 1) return ExchangeAlgorithm::kAllgather;
  const double k = std::ceil(density * static_cast<double>(numel));
  const double allgather_bytes = k * (world_size - 1) * kBytesPerElement;
  if (world_size >= kSparseMinWorld && allgather_bytes >= kSparseMinBytes) {
    return ExchangeAlgorithm::kSparseAllreduce;
  }
  return ExchangeAlgorithm::kDirect;
}

}  // namespace dgc
