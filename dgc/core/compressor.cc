#include "dgc/core/compressor.h"

#include <algorithm>
#include <limits>

#include "dgc/core/error.h"
#include "dgc/core/float16.h"
#include "dgc/core/kernels.h"
#include "dgc/core/momentum.h"
#include "dgc/core/thread_pool.h"

namespace dgc {

struct Compressor::Workspace {
  std::unique_ptr<ThreadPool> pool;
  detail::PassScratch scratch;
  // Per tensor: recent sampled thresholds. They only decide whether a read-only second pass
  // runs; they never change a result.
  std::vector<detail::ThresholdHistory> histories;
};

namespace {

void check_options(const CompressionOptions& o) {
  DGC_CHECK(o.momentum.factor >= 0.0 && o.momentum.factor <= 1.0,
            "momentum must be in [0, 1], got ", o.momentum.factor);
  DGC_CHECK(o.selection.sample_ratio > 0.0 && o.selection.sample_ratio <= 1.0,
            "sample_ratio must be in (0, 1], got ", o.selection.sample_ratio);
  DGC_CHECK(o.selection.lower_ratio >= 0.0 && o.selection.lower_ratio <= 1.0,
            "lower_ratio must be in [0, 1], got ", o.selection.lower_ratio);
  DGC_CHECK(o.selection.upper_ratio >= 1.0, "upper_ratio must be >= 1, got ",
            o.selection.upper_ratio);
  DGC_CHECK(o.selection.threshold_decay > 0.0 && o.selection.threshold_decay < 1.0,
            "threshold_decay must be in (0, 1), got ", o.selection.threshold_decay);
  DGC_CHECK_GE(o.selection.max_rounds, 0, "max_rounds must not be negative");
  DGC_CHECK(o.selection.method == SelectionMethod::kSampled ||
                o.selection.method == SelectionMethod::kExact,
            "unknown selection method ", static_cast<int>(o.selection.method));
  DGC_CHECK(o.value_type == ValueType::kFloat32 || o.value_type == ValueType::kFloat16 ||
                o.value_type == ValueType::kBFloat16,
            "unknown value type ", static_cast<int>(o.value_type));
  DGC_CHECK_GE(o.threads, 1, "threads must be at least 1");
  DGC_CHECK_GE(o.min_numel_per_thread, 1, "min_numel_per_thread must be at least 1");
}

}  // namespace

float round_to(float value, ValueType type) {
  switch (type) {
    case ValueType::kFloat32:
      return value;
    case ValueType::kFloat16:
      return fp16_to_float(fp16_from_float(value));
    case ValueType::kBFloat16:
      return bf16_to_float(bf16_from_float(value));
  }
  throw InvalidArgument(detail::concat("unknown value type ", static_cast<int>(type)));
}

void round_with_residual(std::span<float> values, std::span<float> residual, ValueType type) {
  DGC_CHECK_EQ(values.size(), residual.size(), "one residual per value");
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = values[i] + residual[i];
    values[i] = round_to(x, type);
    residual[i] = x - values[i];
  }
}

void round_with_residual(std::span<float> values, std::span<const float> residual,
                         std::span<float> next_residual, ValueType type) {
  DGC_CHECK_EQ(values.size(), residual.size(), "one residual per value");
  DGC_CHECK_EQ(next_residual.size(), residual.size(), "one new residual per residual");
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = values[i] + residual[i];
    values[i] = round_to(x, type);
    next_residual[i] = x - values[i];
  }
}

Compressor::Compressor(std::vector<int64_t> numels, CompressionOptions options)
    : numels_(std::move(numels)), options_(options), rng_(options.seed) {
  check_options(options_);
  momentum_.reserve(numels_.size());
  velocity_.reserve(numels_.size());
  for (size_t t = 0; t < numels_.size(); ++t) {
    DGC_CHECK(numels_[t] >= 0 && numels_[t] <= int64_t{std::numeric_limits<uint32_t>::max()},
              "tensor ", t, " has ", numels_[t],
              " elements; indices are 32-bit, so split larger tensors");
    momentum_.emplace_back(static_cast<size_t>(numels_[t]), 0.0f);
    velocity_.emplace_back(static_cast<size_t>(numels_[t]), 0.0f);
  }
  staged_momentum_.resize(numels_.size());
  staged_velocity_.resize(numels_.size());
  is_staged_.assign(numels_.size(), 0);
}

Compressor::Compressor(const Compressor& other)
    : numels_(other.numels_),
      options_(other.options_),
      momentum_(other.momentum_),
      velocity_(other.velocity_),
      rng_(other.rng_),
      staged_momentum_(other.numels_.size()),
      staged_velocity_(other.numels_.size()),
      is_staged_(other.numels_.size(), 0) {}

Compressor& Compressor::operator=(const Compressor& other) {
  if (this != &other) {
    numels_ = other.numels_;
    options_ = other.options_;
    momentum_ = other.momentum_;
    velocity_ = other.velocity_;
    rng_ = other.rng_;
    staged_momentum_.assign(numels_.size(), {});
    staged_velocity_.assign(numels_.size(), {});
    is_staged_.assign(numels_.size(), 0);
    staged_rng_active_ = false;
    stage_failed_ = false;
    workspace_.reset();
  }
  return *this;
}

Compressor::Compressor(Compressor&& other) noexcept = default;
Compressor& Compressor::operator=(Compressor&& other) noexcept = default;
Compressor::~Compressor() = default;

Compressor::Workspace& Compressor::workspace() {
  if (!workspace_) workspace_ = std::make_unique<Workspace>();
  return *workspace_;
}

void Compressor::return_to_velocity(size_t t, const Selection& unapplied) {
  DGC_CHECK_LT(t, velocity_.size(), "no such tensor");
  DGC_CHECK(!is_staged_[t], "tensor ", t, " has a staged step: commit() it first");
  DGC_CHECK_EQ(unapplied.indices.size(), unapplied.values.size(), "one value per index");
  std::vector<float>& v = velocity_[t];
  for (size_t j = 0; j < unapplied.indices.size(); ++j) {
    DGC_CHECK_LT(size_t{unapplied.indices[j]}, v.size(), "tensor ", t, ": index out of range");
    v[unapplied.indices[j]] += unapplied.values[j];
  }
}

std::span<float> Compressor::momentum(size_t t) {
  DGC_CHECK_LT(t, momentum_.size(), "no such tensor");
  return momentum_[t];
}
std::span<float> Compressor::velocity(size_t t) {
  DGC_CHECK_LT(t, velocity_.size(), "no such tensor");
  return velocity_[t];
}
std::span<const float> Compressor::momentum(size_t t) const {
  DGC_CHECK_LT(t, momentum_.size(), "no such tensor");
  return momentum_[t];
}
std::span<const float> Compressor::velocity(size_t t) const {
  DGC_CHECK_LT(t, velocity_.size(), "no such tensor");
  return velocity_[t];
}

void Compressor::step(size_t t, std::span<const float> grad, double density, Selection& out) {
  DGC_CHECK_LT(t, numels_.size(), "no such tensor");
  DGC_CHECK(!is_staged_[t], "tensor ", t, " has a staged step: commit() or discard() it first");
  run_step(t, grad, density, out, momentum_[t], velocity_[t], nullptr, nullptr, rng_);
}

void Compressor::stage(size_t t, std::span<const float> grad, double density, Selection& out) {
  DGC_CHECK_LT(t, numels_.size(), "no such tensor");
  DGC_CHECK(!is_staged_[t], "tensor ", t, " is staged twice: commit() or discard() first");
  if (!staged_rng_active_) {
    staged_rng_ = rng_;  // 2.5 KB: the one copy a staged step makes
    staged_rng_active_ = true;
  }
  const size_t n = velocity_[t].size();
  staged_momentum_[t].resize(n);
  staged_velocity_[t].resize(n);
  is_staged_[t] = 1;
  try {
    run_step(t, grad, density, out, staged_momentum_[t], staged_velocity_[t], momentum_[t].data(),
             velocity_[t].data(), staged_rng_);
  } catch (...) {
    stage_failed_ = true;
    throw;
  }
}

void Compressor::commit() {
  if (stage_failed_) {
    throw InvalidArgument(
        "a staged step threw (non-finite values): its state is unusable, discard() it");
  }
  for (size_t t = 0; t < is_staged_.size(); ++t) {
    if (!is_staged_[t]) continue;
    momentum_[t].swap(staged_momentum_[t]);
    velocity_[t].swap(staged_velocity_[t]);
    is_staged_[t] = 0;
  }
  if (staged_rng_active_) rng_ = staged_rng_;
  staged_rng_active_ = false;
}

void Compressor::discard() {
  std::fill(is_staged_.begin(), is_staged_.end(), uint8_t{0});
  staged_rng_active_ = false;
  stage_failed_ = false;
}

void Compressor::run_step(size_t t, std::span<const float> grad, double density, Selection& out,
                          std::vector<float>& u, std::vector<float>& v, const float* source_u,
                          const float* source_v, std::mt19937_64& rng) {
  check_density(density);
  DGC_CHECK_EQ(grad.size(), v.size(), "gradient of tensor ", t, " has the wrong length");
  const size_t n = v.size();
  const MomentumOptions& mo = options_.momentum;

  Workspace& work = workspace();
  const size_t parts = detail::part_count(n, options_.threads, options_.min_numel_per_thread);
  ThreadPool* pool = nullptr;
  if (parts > 1) {
    if (!work.pool) work.pool = std::make_unique<ThreadPool>(options_.threads);
    pool = work.pool.get();
  }
  detail::PassTarget target;
  target.velocity = v.data();
  target.size = n;
  target.update = mo.nesterov ? detail::Update::kNesterov : detail::Update::kPlain;
  target.momentum = u.data();
  target.grad = grad.data();
  target.m = static_cast<float>(mo.factor);
  target.source_momentum = source_u;
  target.source_velocity = source_v;

  const size_t k = target_count(n, density);
  try {
    if (options_.selection.method == SelectionMethod::kSampled) {
      work.histories.resize(numels_.size());
      detail::sampled_select(target, k, density, options_.selection, rng, out, parts, pool,
                             work.scratch, /*reset_on_nonfinite=*/true, &work.histories[t]);
    } else {
      // The update pass with an infinite threshold gathers only non-finite elements.
      detail::fused_pass(target, std::numeric_limits<float>::infinity(), parts, pool, work.scratch);
      detail::throw_if_nonfinite(target, work.scratch, /*reset_state=*/true);
      detail::exact_select(v, k, out);
      size_t kept = 0;
      for (size_t j = 0; j < out.indices.size(); ++j) {
        if (out.values[j] == 0.0f) continue;
        out.indices[kept] = out.indices[j];
        out.values[kept] = out.values[j];
        ++kept;
      }
      out.indices.resize(kept);
      out.values.resize(kept);
    }
  } catch (const NumericError& e) {
    throw NumericError(detail::concat("tensor ", t, ": ", e.what()));
  }
  if (options_.value_type != ValueType::kFloat32) {
    for (float& value : out.values) value = round_to(value, options_.value_type);
  }
  mask_sent(u, v, out.indices, out.values, mo);
}

}  // namespace dgc
