// Where the residual stands: what each rank has accumulated but not yet sent, measured per epoch
// on one rank (dgc train --residual-stats). A diagnostic for DGC's accuracy at scale
// (docs/results.md, "Accuracy as workers are added"): with more workers an epoch has fewer steps,
// and an element whose accumulated velocity stays under the selection threshold waits more of the
// run in the residual.
//
// Per epoch: the mean age of the elements this rank sent (steps since the element was last sent
// by this rank, or since the first step), the fraction of compressed elements this rank has never
// sent, and the residual's mass (sum of |v|) against the mass this rank sent in the epoch. With an
// exchange that lists each position once per rank that selected it (allgather, direct), also the
// overlap of the selections across ranks: the fraction of this rank's selected indices that at
// least one other rank (or every rank) selected in the same step, over every kept step of the
// epoch (the density warm-up's included), with no extra communication.
// Costs one int32 and one byte per compressed element and a pass over the selected and the
// received elements per step.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/core/selection.h"

namespace dgc::train {

class DistributedStep;

struct ResidualEpochStats {
  double sent_age_mean = 0.0;  // steps since the element was last sent, over the epoch's sends
  double sent_age_p90 = 0.0;   // ... the 90th percentile (of ages capped at 65,535 steps)
  double never_sent_fraction = 0.0;  // compressed elements never sent by this rank since step 0
  double residual_l1 = 0.0;          // sum of |v| over the compressed tensors at the epoch's end
  double sent_l1 = 0.0;              // sum of |value| of every element this rank sent in the epoch
  // residual_l1 / sent_l1: the residual in epochs of this rank's sending.
  double residual_epochs = 0.0;
  // Of this rank's selected indices in the epoch's steps, the fraction that at least one other
  // rank also selected in the same step, and the fraction that every rank selected; empty
  // unless record_overlap() saw a step with more than one rank.
  std::optional<double> selection_overlap;
  std::optional<double> selection_shared_all;
};

class ResidualStats {
 public:
  // The first `tensors` of the compressor's tensors (the compressed ones, not the dense-path
  // group).
  ResidualStats(const Compressor& compressor, size_t tensors);

  // After a kept step `iteration` (0-based): the selections it sent, one per compressor tensor
  // (those past `tensors` are ignored).
  void record(int64_t iteration, std::span<const Selection> sent);

  // After the same step: `written[t]` lists the positions the exchange added into compressed
  // tensor t's update, each once per rank that selected it (this rank's included:
  // Exchange::last_written with allgather or direct), `ranks` the number of ranks. Counts which
  // of this rank's `sent` indices other ranks also selected. Tensors past `tensors` are ignored.
  void record_overlap(std::span<const Selection> sent,
                      std::span<const std::span<const uint64_t>> written, int ranks);

  // The epoch's statistics, with the compressor's velocity now; starts the next epoch's sums.
  ResidualEpochStats take(const Compressor& compressor);

 private:
  std::vector<std::vector<int32_t>> last_sent_;  // per element: 1 + the step it was last sent
  std::vector<uint64_t> age_histogram_;          // the epoch's send ages (capped)
  double age_sum_ = 0.0;
  uint64_t sends_ = 0;
  double sent_l1_ = 0.0;
  std::vector<std::vector<uint8_t>> selected_by_;  // per element: ranks (saturating), 0 between
  uint64_t overlap_selected_ = 0;  // this rank's selected indices counted by record_overlap
  uint64_t overlap_shared_ = 0;    // ... of which another rank selected too
  uint64_t overlap_all_ = 0;       // ... of which every rank selected
};

// After a kept step of `step` (one bucket, unbucketed): its selections into stats.record_overlap,
// with the exchange's written positions, when the exchange lists a position once per rank that
// selected it (allgather, direct); nothing with sparse-allreduce.
void record_selection_overlap(const DistributedStep& step, ResidualStats& stats);

}  // namespace dgc::train
