#include "dgc/exchange/algorithm.h"

#include <cmath>

#include "dgc/core/error.h"
#include "dgc/core/selection.h"

namespace dgc {

ExchangeAlgorithm parse_exchange_algorithm(const std::string& name) {
  return parse_name(kExchangeAlgorithmNames, name, "exchange algorithm");
}

const char* to_string(ExchangeAlgorithm algorithm) {
  return name_of(kExchangeAlgorithmNames, algorithm);
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
