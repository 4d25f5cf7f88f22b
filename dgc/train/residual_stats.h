// Where the residual stands: what each rank has accumulated but not yet sent, measured per epoch
// on one rank (dgc train --residual-stats). A diagnostic for DGC's accuracy at scale
// (docs/results.md, "Accuracy as workers are added"): with more workers an epoch has fewer steps,
// and an element whose accumulated velocity stays under the selection threshold waits more of the
// run in the residual.
//
// Per epoch: the mean age of the elements this rank sent (steps since the element was last sent
// by this rank, or since the first step), the fraction of compressed elements this rank has never
// sent, and the residual's mass (sum of |v|) against the mass this rank sent in the epoch.
// Costs one int32 per compressed element and a pass over the selected elements per step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/core/selection.h"

namespace dgc::train {

struct ResidualEpochStats {
  double sent_age_mean = 0.0;  // steps since the element was last sent, over the epoch's sends
  double sent_age_p90 = 0.0;   // ... the 90th percentile (of ages capped at 65,535 steps)
  double never_sent_fraction = 0.0;  // compressed elements never sent by this rank since step 0
  double residual_l1 = 0.0;          // sum of |v| over the compressed tensors at the epoch's end
  double sent_l1 = 0.0;              // sum of |value| of every element this rank sent in the epoch
  // residual_l1 / sent_l1: the residual in epochs of this rank's sending.
  double residual_epochs = 0.0;
};

class ResidualStats {
 public:
  // The first `tensors` of the compressor's tensors (the compressed ones, not the dense-path
  // group).
  ResidualStats(const Compressor& compressor, size_t tensors);

  // After a kept step `iteration` (0-based): the selections it sent, one per compressor tensor
  // (those past `tensors` are ignored).
  void record(int64_t iteration, std::span<const Selection> sent);

  // The epoch's statistics, with the compressor's velocity now; starts the next epoch's sums.
  ResidualEpochStats take(const Compressor& compressor);

 private:
  std::vector<std::vector<int32_t>> last_sent_;  // per element: 1 + the step it was last sent
  std::vector<uint64_t> age_histogram_;          // the epoch's send ages (capped)
  double age_sum_ = 0.0;
  uint64_t sends_ = 0;
  double sent_l1_ = 0.0;
};

}  // namespace dgc::train
