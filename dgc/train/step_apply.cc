// Phase 5 of DistributedStep (step.h): the directions, written out (run) or applied to the
// weights in the same pass (run_and_apply); phases 1 to 4 are in step.cc. Also BucketedStep's
// one-bucket run_and_apply (buckets.h).
#include <algorithm>
#include <chrono>
#include <vector>

#include "dgc/train/buckets.h"
#include "dgc/train/step.h"
#include "dgc/train/step_kernels.h"

namespace dgc::train {

namespace {
template <typename Span>
std::vector<size_t> sizes_of(std::span<const Span> spans) {
  std::vector<size_t> sizes;
  sizes.reserve(spans.size());
  for (const auto& s : spans) sizes.push_back(s.size());
  return sizes;
}
}  // namespace

bool DistributedStep::run(std::span<const std::span<float>> grads,
                          std::span<const std::span<const float>> weights,
                          std::span<const std::span<float>> directions) {
  const auto start = Clock::now();
  check_sizes(grads, sizes_of(weights), sizes_of(directions));
  if (!exchange_phases(grads, start)) {
    for (const auto& d : directions) std::fill(d.begin(), d.end(), 0.0f);
    finish_step();
    return false;
  }

  // 5. The directions.
  const kernels::DirectionFactors f = direction_factors();
  if (!routing_.grouped) {
    for (size_t j = 0; j < routing_.dense.size(); ++j) {
      const size_t t = routing_.dense[j];
      kernels::dense_direction(dense_path_.flat.data() + dense_path_.offsets[j], weights[t].data(),
                               dense_path_.momentum[j].data(), directions[t].data(),
                               weights[t].size(), f);
    }
  }
  for (size_t i = 0; i < routing_.compressed.size(); ++i) {
    const size_t t = routing_.compressed[i];
    kernels::compressed_direction(weights[t].data(), tensors_.updates[i].data(),
                                  tensors_.decay_momentum[i].data(), directions[t].data(),
                                  tensors_.updates[i].size(), f);
  }
  if (routing_.grouped) {
    for (size_t j = 0; j < routing_.dense.size(); ++j) {
      const size_t at = dense_path_.offsets[j];
      const size_t t = routing_.dense[j];
      kernels::compressed_direction(weights[t].data(), tensors_.updates[group()].data() + at,
                                    tensors_.decay_momentum[group()].data() + at,
                                    directions[t].data(), weights[t].size(), f);
    }
  }
  finish_step();
  return true;
}

bool DistributedStep::run_and_apply(std::span<const std::span<float>> grads,
                                    std::span<const std::span<float>> weights) {
  const auto start = Clock::now();
  check_sizes(grads, sizes_of(weights), {});
  kernels::DirectionFactors f = direction_factors();
  f.lr = static_cast<float>(update_lr_at(iteration_));
  if (!exchange_phases(grads, start)) {
    finish_step();
    return false;
  }

  // 5. The directions, applied: one pass over w and its momentum per tensor.
  if (!routing_.grouped) {
    for (size_t j = 0; j < routing_.dense.size(); ++j) {
      const size_t t = routing_.dense[j];
      kernels::dense_apply(dense_path_.flat.data() + dense_path_.offsets[j], weights[t].data(),
                           dense_path_.momentum[j].data(), weights[t].size(), f);
    }
  }
  // Compressed tensors and the group: the update only where the exchange wrote it.
  std::vector<kernels::SparseApply::Segment>& segments = sparse_.segments;
  for (size_t i = 0; i < tensors_.updates.size(); ++i) {
    segments.clear();
    if (i < routing_.compressed.size()) {
      const auto& w = weights[routing_.compressed[i]];
      segments.push_back({0, w.size(), w.data(), tensors_.decay_momentum[i].data()});
    } else {
      for (size_t j = 0; j < routing_.dense.size(); ++j) {
        const auto& w = weights[routing_.dense[j]];
        segments.push_back({dense_path_.offsets[j], w.size(), w.data(),
                            tensors_.decay_momentum[i].data() + dense_path_.offsets[j]});
      }
    }
    sparse_.apply.save(exchange_->last_written(i), segments);
    if (f.wd != 0.0f) {
      for (const auto& s : segments) kernels::SparseApply::apply_decay(s.w, s.b, s.n, f);
    }
    sparse_.apply.finish(tensors_.updates[i].data(), f);
  }
  finish_step();
  return true;
}

kernels::DirectionFactors DistributedStep::direction_factors() const {
  kernels::DirectionFactors f;
  f.m = static_cast<float>(options_.compressor.momentum.factor);
  f.nesterov = options_.compressor.momentum.nesterov;
  f.wd = static_cast<float>(options_.weight_decay * lr_factor_at(iteration_));
  return f;
}

// BucketedStep's one-bucket path through run_and_apply (buckets.h).
bool BucketedStep::run_and_apply(std::span<const std::span<float>> grads,
                                 std::span<const std::span<float>> weights) {
  DGC_CHECK_EQ(steps_.size(), 1u, "run_and_apply takes the step of one bucket");
  DGC_CHECK(!in_flight(), "run_and_apply while a step is in flight");
  const auto start = std::chrono::steady_clock::now();
  return one_bucket_done(steps_[0]->run_and_apply(grads, weights), start);
}

bool BucketedStep::one_bucket_done(bool taken, std::chrono::steady_clock::time_point start) {
  last_bytes_ = steps_[0]->last_bytes();
  total_bytes_ = steps_[0]->total_bytes();
  post_warmup_bytes_ = steps_[0]->post_warmup_bytes();
  timings_ = steps_[0]->last_timings();
  wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return taken;
}

}  // namespace dgc::train
