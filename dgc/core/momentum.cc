#include "dgc/core/momentum.h"

#include "dgc/core/error.h"
#include "dgc/core/kernels.h"

namespace dgc {
namespace {

template <detail::Update kUpdate>
void accumulate(float* __restrict u, float* __restrict v, const float* __restrict g, size_t n,
                float m) {
  for (size_t i = 0; i < n; ++i) detail::update_one<kUpdate>(u[i], v[i], g[i], m);
}

}  // namespace

void accumulate_velocity(std::span<float> momentum, std::span<float> velocity,
                         std::span<const float> grad, const MomentumOptions& options) {
  DGC_CHECK_EQ(momentum.size(), velocity.size(), "momentum and velocity must have equal length");
  DGC_CHECK_EQ(grad.size(), velocity.size(), "gradient and velocity must have equal length");
  const float m = static_cast<float>(options.factor);
  if (options.nesterov) {
    accumulate<detail::Update::kNesterov>(momentum.data(), velocity.data(), grad.data(),
                                          grad.size(), m);
  } else {
    accumulate<detail::Update::kPlain>(momentum.data(), velocity.data(), grad.data(), grad.size(),
                                       m);
  }
}

void mask_sent(std::span<float> momentum, std::span<float> velocity,
               std::span<const uint32_t> indices, std::span<const float> sent,
               const MomentumOptions& options) {
  DGC_CHECK_EQ(momentum.size(), velocity.size(), "momentum and velocity must have equal length");
  DGC_CHECK_EQ(indices.size(), sent.size(), "one sent value per index");
  const size_t n = velocity.size();
  for (size_t j = 0; j < indices.size(); ++j) {
    const uint32_t i = indices[j];
    DGC_CHECK_LT(i, n, "sent index out of range of the tensor");
    velocity[i] -= sent[j];
    if (options.masking) momentum[i] = 0.0f;
  }
}

}  // namespace dgc
