#include "dgc/train/residual_stats.h"

#include <algorithm>
#include <cmath>

#include "dgc/train/step.h"

namespace dgc::train {
namespace {
constexpr int64_t kMaxAge = 65535;
}  // namespace

ResidualStats::ResidualStats(const Compressor& compressor, size_t tensors)
    : age_histogram_(static_cast<size_t>(kMaxAge) + 1, 0) {
  tensors = std::min(tensors, compressor.num_tensors());
  last_sent_.reserve(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    last_sent_.emplace_back(compressor.velocity(t).size(), 0);
    selected_by_.emplace_back(compressor.velocity(t).size(), 0);
  }
}

void ResidualStats::record(int64_t iteration, std::span<const Selection> sent) {
  const size_t tensors = std::min(sent.size(), last_sent_.size());
  for (size_t t = 0; t < tensors; ++t) {
    auto& last = last_sent_[t];
    const Selection& s = sent[t];
    for (size_t j = 0; j < s.indices.size(); ++j) {
      int32_t& when = last[s.indices[j]];
      // when == 0: never sent; the age counts from the first step.
      const int64_t age = iteration + 1 - (when == 0 ? 0 : static_cast<int64_t>(when));
      age_sum_ += static_cast<double>(age);
      ++age_histogram_[static_cast<size_t>(std::min(age, kMaxAge))];
      ++sends_;
      sent_l1_ += std::fabs(static_cast<double>(s.values[j]));
      when = static_cast<int32_t>(iteration + 1);
    }
  }
}

void ResidualStats::record_overlap(std::span<const Selection> sent,
                                   std::span<const std::span<const uint64_t>> written, int ranks) {
  if (ranks < 2) return;
  const size_t tensors = std::min({sent.size(), written.size(), selected_by_.size()});
  const int all = std::min(ranks, 255);
  for (size_t t = 0; t < tensors; ++t) {
    auto& by = selected_by_[t];
    for (const uint64_t p : written[t]) {
      if (p < by.size() && by[p] < 255) ++by[p];
    }
    for (const uint32_t i : sent[t].indices) {
      const int count = by[i];
      if (count == 0) continue;  // not in the exchange's list: nothing known
      ++overlap_selected_;
      if (count >= 2) ++overlap_shared_;
      if (count >= all) ++overlap_all_;
    }
    for (const uint64_t p : written[t]) {
      if (p < by.size()) by[p] = 0;
    }
  }
}

ResidualEpochStats ResidualStats::take(const Compressor& compressor) {
  ResidualEpochStats out;
  if (sends_ > 0) {
    out.sent_age_mean = age_sum_ / static_cast<double>(sends_);
    const uint64_t rank90 = (sends_ * 9 + 9) / 10;  // ceil(0.9 * sends)
    uint64_t seen = 0;
    for (size_t age = 0; age < age_histogram_.size(); ++age) {
      seen += age_histogram_[age];
      if (seen >= rank90) {
        out.sent_age_p90 = static_cast<double>(age);
        break;
      }
    }
  }
  uint64_t elements = 0;
  uint64_t never = 0;
  for (const auto& last : last_sent_) {
    elements += last.size();
    never += static_cast<uint64_t>(std::count(last.begin(), last.end(), 0));
  }
  out.never_sent_fraction = elements > 0 ? static_cast<double>(never) / elements : 0.0;
  for (size_t t = 0; t < last_sent_.size(); ++t) {
    for (float v : compressor.velocity(t)) out.residual_l1 += std::fabs(static_cast<double>(v));
  }
  out.sent_l1 = sent_l1_;
  out.residual_epochs = sent_l1_ > 0.0 ? out.residual_l1 / sent_l1_ : 0.0;
  if (overlap_selected_ > 0) {
    const auto selected = static_cast<double>(overlap_selected_);
    out.selection_overlap = static_cast<double>(overlap_shared_) / selected;
    out.selection_shared_all = static_cast<double>(overlap_all_) / selected;
  }
  std::fill(age_histogram_.begin(), age_histogram_.end(), 0);
  age_sum_ = 0.0;
  sends_ = 0;
  sent_l1_ = 0.0;
  overlap_selected_ = 0;
  overlap_shared_ = 0;
  overlap_all_ = 0;
  return out;
}

void record_selection_overlap(const DistributedStep& step, ResidualStats& stats) {
  const ExchangeAlgorithm algorithm = step.exchange_algorithm();
  if (algorithm != ExchangeAlgorithm::kAllgather && algorithm != ExchangeAlgorithm::kDirect) {
    return;
  }
  std::vector<std::span<const uint64_t>> written(step.compressed_tensors());
  for (size_t t = 0; t < written.size(); ++t) written[t] = step.last_written(t);
  stats.record_overlap(step.last_selections(), written, step.world_size());
}

}  // namespace dgc::train
