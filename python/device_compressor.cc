#include "python/device_compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dgc/core/error.h"

namespace dgc::python {
namespace {

constexpr float kSmallestPositive = std::numeric_limits<float>::denorm_min();

torch::Tensor flat_float(const torch::Tensor& t, torch::Device device, int64_t numel,
                         size_t index) {
  DGC_CHECK(t.defined(), "the gradient of tensor ", index, " is undefined");
  DGC_CHECK_EQ(t.numel(), numel, "elements of the gradient of tensor ", index);
  DGC_CHECK(t.scalar_type() == torch::kFloat32, "the gradient of tensor ", index,
            " must be float32, got ", c10::toString(t.scalar_type()));
  DGC_CHECK(t.device() == device, "the gradient of tensor ", index, " is on ", t.device().str(),
            " but the compressor's state is on ", device.str());
  return t.reshape({-1});
}

// The elements of a bool mask, ascending (one synchronisation with the host).
torch::Tensor positions(const torch::Tensor& mask) { return mask.nonzero().reshape({-1}); }

}  // namespace

Selection DeviceSelection::to_host() const {
  Selection out;
  const torch::Tensor i = indices.to(torch::kCPU, torch::kInt64).contiguous();
  const torch::Tensor v = values.to(torch::kCPU, torch::kFloat32).contiguous();
  const auto n = static_cast<size_t>(i.numel());
  out.indices.resize(n);
  out.values.resize(n);
  const int64_t* ip = i.data_ptr<int64_t>();
  std::transform(ip, ip + n, out.indices.begin(),
                 [](int64_t x) { return static_cast<uint32_t>(x); });
  std::copy_n(v.data_ptr<float>(), n, out.values.begin());
  out.threshold = threshold;
  out.rounds = rounds;
  out.hierarchical = hierarchical;
  return out;
}

torch::Tensor top_k_mask(const torch::Tensor& magnitudes, int64_t k, float& kth) {
  DGC_CHECK(k > 0 && k <= magnitudes.numel(), "top-k of ", magnitudes.numel(),
            " elements with k = ", k);
  kth = std::get<0>(magnitudes.topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/false))
            .min()
            .item<float>();
  const torch::Tensor above = magnitudes > kth;
  const int64_t needed = k - above.sum().item<int64_t>();
  // Of the elements equal to the k-th largest, the `needed` ones of lowest position.
  const torch::Tensor at = magnitudes == kth;
  return above | (at & (at.cumsum(0) <= needed));
}

torch::Tensor round_values(const torch::Tensor& values, ValueType type) {
  switch (type) {
    case ValueType::kFloat32:
      return values;
    case ValueType::kFloat16:  // round to nearest even; beyond 65504 saturate, as fp16_from_float
      return values.clamp(-65504.0, 65504.0).to(torch::kHalf).to(torch::kFloat32);
    case ValueType::kBFloat16: {
      const double largest = std::numeric_limits<c10::BFloat16>::max();
      return values.clamp(-largest, largest).to(torch::kBFloat16).to(torch::kFloat32);
    }
  }
  throw InvalidArgument(detail::concat("unknown value type ", static_cast<int>(type)));
}

DeviceCompressor::DeviceCompressor(std::vector<int64_t> numels, CompressionOptions options,
                                   torch::Device device)
    : numels_(std::move(numels)), options_(options), device_(device), rng_(options.seed) {
  DGC_CHECK(options_.momentum.factor >= 0.0 && options_.momentum.factor <= 1.0,
            "momentum must be in [0, 1], got ", options_.momentum.factor);
  DGC_CHECK(options_.selection.sample_ratio > 0.0 && options_.selection.sample_ratio <= 1.0,
            "sample_ratio must be in (0, 1], got ", options_.selection.sample_ratio);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  for (size_t t = 0; t < numels_.size(); ++t) {
    DGC_CHECK(numels_[t] >= 0 && numels_[t] <= int64_t{std::numeric_limits<uint32_t>::max()},
              "tensor ", t, " has ", numels_[t],
              " elements; indices are 32-bit, so split larger tensors");
    momentum_.push_back(torch::zeros({numels_[t]}, f32));
    velocity_.push_back(torch::zeros({numels_[t]}, f32));
  }
  staged_momentum_.resize(numels_.size());
  staged_velocity_.resize(numels_.size());
}

torch::Tensor& DeviceCompressor::momentum(size_t t) {
  DGC_CHECK_LT(t, momentum_.size(), "no such tensor");
  return momentum_[t];
}

torch::Tensor& DeviceCompressor::velocity(size_t t) {
  DGC_CHECK_LT(t, velocity_.size(), "no such tensor");
  return velocity_[t];
}

void DeviceCompressor::step(size_t t, const torch::Tensor& grad, double density,
                            DeviceSelection& out) {
  DGC_CHECK(!staged_rng_active_, "a step is staged: commit() or discard() it first");
  stage(t, grad, density, out);
  commit();
}

void DeviceCompressor::stage(size_t t, const torch::Tensor& grad, double density,
                             DeviceSelection& out) {
  DGC_CHECK_LT(t, numels_.size(), "no such tensor");
  DGC_CHECK(!staged_momentum_[t].defined(), "tensor ", t,
            " is staged twice: commit() or discard() first");
  check_density(density);
  const torch::Tensor g = flat_float(grad, device_, numels_[t], t);
  if (!staged_rng_active_) {
    staged_rng_ = rng_;
    staged_rng_active_ = true;
  }
  torch::NoGradGuard no_grad;
  const MomentumOptions& mo = options_.momentum;
  const double m = static_cast<float>(mo.factor);  // the core's float m, exactly
  // 2. Momentum correction, out of place (the committed u and v stay as they are).
  torch::Tensor u, v;
  if (mo.nesterov) {
    u = torch::add(momentum_[t], g).mul_(m);
    v = torch::add(velocity_[t], u).add_(g);
  } else {
    u = torch::mul(momentum_[t], m).add_(g);
    v = torch::add(velocity_[t], u);
  }
  staged_momentum_[t] = u;
  staged_velocity_[t] = v;
  try {
    // |v| once, for the finite check (its maximum is NaN or infinite iff an element is) and for
    // the selection.
    const torch::Tensor magnitude = v.abs();
    if (numels_[t] > 0 && !std::isfinite(magnitude.max().item<float>())) {
      const int64_t first = positions(~torch::isfinite(v))[0].item<int64_t>();
      throw NumericError(
          detail::concat("tensor ", t, ": non-finite velocity at index ", first, " of ", numels_[t],
                         " elements: the gradient or the accumulated state holds NaN or infinity"));
    }
    // 3. Selection.
    select_magnitudes(v, magnitude, density, staged_rng_, out);
  } catch (...) {
    stage_failed_ = true;
    throw;
  }
  // 4. The values as the receivers decode them; 5. masking at the sent positions.
  out.values = round_values(out.values, options_.value_type);
  if (out.indices.numel() > 0) {
    v.index_copy_(0, out.indices, v.index_select(0, out.indices).sub_(out.values));
    if (mo.masking) u.index_fill_(0, out.indices, 0.0f);
  }
}

void DeviceCompressor::select(const torch::Tensor& velocity, double density, std::mt19937_64& rng,
                              DeviceSelection& out) const {
  torch::NoGradGuard no_grad;
  const torch::Tensor v = velocity.reshape({-1});
  select_magnitudes(v, v.abs(), density, rng, out);
}

void DeviceCompressor::select_magnitudes(const torch::Tensor& v, const torch::Tensor& magnitude,
                                         double density, std::mt19937_64& rng,
                                         DeviceSelection& out) const {
  out.threshold = 0.0f;
  out.rounds = 0;
  out.hierarchical = false;
  const int64_t n = v.numel();
  const auto k = static_cast<int64_t>(target_count(static_cast<size_t>(n), density));
  const auto take = [&](const torch::Tensor& selected) {
    out.indices = selected;
    out.values = v.index_select(0, selected);
  };
  if (k == 0) {
    take(torch::empty({0}, torch::TensorOptions().dtype(torch::kInt64).device(v.device())));
    out.threshold = std::numeric_limits<float>::infinity();
    return;
  }
  const SelectionOptions& o = options_.selection;
  if (o.method == SelectionMethod::kExact) {
    // dgc::select_exact, then the zeros dropped (Compressor::step).
    float kth = 0.0f;
    take(positions(top_k_mask(magnitude, k, kth) & (v != 0)));
    out.threshold = kth;
    return;
  }
  if (k == n) {
    take(positions(v != 0));
    out.threshold = kSmallestPositive;
    return;
  }
  // The sample: s elements, stride n / s, from a random start (one draw).
  const auto s =
      static_cast<int64_t>(sample_count(static_cast<size_t>(n), density, o.sample_ratio));
  const int64_t stride = n / s;
  const auto start = static_cast<int64_t>(rng() % static_cast<uint64_t>(stride));
  const torch::Tensor sample =
      magnitude.narrow(0, start, (s - 1) * stride + 1).slice(0, 0, {}, stride);
  const auto top = static_cast<int64_t>(target_count(static_cast<size_t>(s), density));
  float threshold =
      std::get<0>(sample.topk(top, 0, /*largest=*/true, /*sorted=*/false)).min().item<float>();
  threshold = std::max(threshold, kSmallestPositive);
  // The candidates' positions give their count: one pass per threshold tried.
  torch::Tensor candidates = positions(magnitude >= threshold);
  const double lower = o.lower_ratio * static_cast<double>(k);
  while (static_cast<double>(candidates.numel()) < lower && out.rounds < o.max_rounds &&
         threshold > kSmallestPositive) {
    threshold = std::max(static_cast<float>(threshold * o.threshold_decay), kSmallestPositive);
    ++out.rounds;
    candidates = positions(magnitude >= threshold);
  }
  const int64_t count = candidates.numel();
  out.threshold = threshold;
  if (static_cast<double>(count) > o.upper_ratio * static_cast<double>(k)) {
    // Hierarchical: the exact top-k among the candidates (ascending, so ties go to the lower
    // index as in the core).
    float kth = 0.0f;
    take(candidates.masked_select(top_k_mask(magnitude.index_select(0, candidates), k, kth)));
    out.threshold = kth;
    out.hierarchical = true;
    return;
  }
  take(candidates);
}

void DeviceCompressor::commit() {
  if (stage_failed_) {
    throw InvalidArgument(
        "a staged step threw (non-finite values): its state is unusable, discard() it");
  }
  for (size_t t = 0; t < numels_.size(); ++t) {
    if (!staged_momentum_[t].defined()) continue;
    momentum_[t] = std::move(staged_momentum_[t]);
    velocity_[t] = std::move(staged_velocity_[t]);
    staged_momentum_[t] = torch::Tensor();
    staged_velocity_[t] = torch::Tensor();
  }
  if (staged_rng_active_) rng_ = staged_rng_;
  staged_rng_active_ = false;
}

void DeviceCompressor::discard() {
  for (size_t t = 0; t < numels_.size(); ++t) {
    staged_momentum_[t] = torch::Tensor();
    staged_velocity_[t] = torch::Tensor();
  }
  staged_rng_active_ = false;
  stage_failed_ = false;
}

}  // namespace dgc::python
