// The reference check of an exchange: what Exchange::run must have produced for one compressed
// tensor, computed directly from every rank's selection. One place, used by the exchange tests
// and by `dgc bench exchange` to verify what it timed. Not collective; pure.
//
// The rule, for every algorithm: rank r applied the elements it selected minus those handed back
// to it (Exchange::run's `unapplied`), and the update is their sum over ranks / N:
//   update[i] = sum over ranks r that selected i and did not get it back of round(v_r[i]) / N,
// exactly 0 at every other position. DGC's conservation is checked with it: what a rank got back
// is a subset of what it selected with the same values, and at each position either every rank
// that selected it got its value back or none did (the position was applied or not, globally).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "dgc/core/options.h"
#include "dgc/core/selection.h"

namespace dgc {

struct ReferenceCheck {
  int64_t mismatches = 0;  // positions whose update is wrong + conservation violations
  uint64_t applied = 0;    // positions the rule says were applied
  uint64_t returned = 0;   // elements handed back, over all ranks
  double max_error = 0.0;  // largest |update - expected| over the positions
  std::string first;       // the first problem found, in words ("" when none)
  bool ok() const { return mismatches == 0; }
};

// The relative tolerance of a sum of values of `type`: values travel rounded to the type, and
// sparse-allreduce rounds each reduced sum once more.
double reference_tolerance(ValueType type);

// selected[r]: rank r's selection for this tensor (indices strictly increasing, as given to
// Exchange::run); unapplied[r]: what run() handed back to rank r (empty span: nothing for
// anybody, as with allgather and direct; otherwise one per rank); update: the output of one rank.
// A position is correct when |update - expected| <= reference_tolerance(type) * sum|v| / N.
ReferenceCheck check_update(std::span<const Selection> selected,
                            std::span<const Selection> unapplied, std::span<const float> update,
                            ValueType type);

}  // namespace dgc
