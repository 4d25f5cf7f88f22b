#include "dgc/exchange/reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/core/error.h"

namespace dgc {

double reference_tolerance(ValueType type) {
  switch (type) {
    case ValueType::kFloat32:
      return 1e-6;
    case ValueType::kFloat16:
      return 1e-3;  // 2^-11 per rounding, with room for the sum
    case ValueType::kBFloat16:
      return 8e-3;  // 2^-8 per rounding
  }
  return 1e-6;
}

ReferenceCheck check_update(std::span<const Selection> selected,
                            std::span<const Selection> unapplied, std::span<const float> update,
                            ValueType type) {
  const size_t n = selected.size();
  DGC_CHECK_GE(n, size_t{1}, "one selection per rank");
  DGC_CHECK(unapplied.empty() || unapplied.size() == n, "unapplied: empty or one per rank, found ",
            unapplied.size(), " for ", n, " ranks");
  ReferenceCheck check;
  auto problem = [&](const std::string& what) {
    ++check.mismatches;
    if (check.first.empty()) check.first = what;
  };

  struct Contribution {
    uint32_t index;
    float value;
    bool returned;
  };
  std::vector<Contribution> all;
  for (size_t r = 0; r < n; ++r) {
    const Selection& s = selected[r];
    DGC_CHECK_EQ(s.indices.size(), s.values.size(), "selection of rank ", r);
    const Selection* back = unapplied.empty() ? nullptr : &unapplied[r];
    size_t b = 0;
    for (size_t j = 0; j < s.indices.size(); ++j) {
      bool returned = false;
      if (back && b < back->indices.size() && back->indices[b] == s.indices[j]) {
        if (back->values[b] != s.values[j]) {
          problem(detail::concat("rank ", r, " got back ", back->values[b], " at index ",
                                 s.indices[j], " but selected ", s.values[j]));
        }
        returned = true;
        ++b;
        ++check.returned;
      }
      all.push_back({s.indices[j], round_to(s.values[j], type), returned});
    }
    if (back && b != back->indices.size()) {
      problem(detail::concat("rank ", r, " got back ", back->indices.size() - b,
                             " element(s) it did not select (or out of order), the first at index ",
                             back->indices[b]));
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Contribution& a, const Contribution& b) { return a.index < b.index; });

  const double inv_n = 1.0 / static_cast<double>(n);
  const double tolerance = reference_tolerance(type);
  size_t next = 0;  // first position not yet checked
  auto expect_zero_until = [&](size_t end) {
    for (; next < end && next < update.size(); ++next) {
      if (update[next] != 0.0f) {
        problem(detail::concat("index ", next, ": nothing applied there, the update is ",
                               update[next]));
        check.max_error = std::max(check.max_error, std::fabs(double{update[next]}));
      }
    }
  };
  for (size_t i = 0; i < all.size();) {
    const uint32_t index = all[i].index;
    DGC_CHECK_LT(size_t{index}, update.size(), "selected index out of the update's range");
    double sum = 0.0, magnitude = 0.0;
    size_t returned = 0, count = 0;
    for (; i < all.size() && all[i].index == index; ++i, ++count) {
      magnitude += std::fabs(all[i].value);
      if (all[i].returned) {
        ++returned;
      } else {
        sum += all[i].value;
      }
    }
    if (returned != 0 && returned != count) {
      problem(detail::concat("index ", index, ": ", returned, " of the ", count,
                             " ranks that selected it got it back, the others did not"));
    }
    if (returned != count) ++check.applied;
    expect_zero_until(index);
    const double expected = sum * inv_n;
    const double error = std::fabs(update[index] - expected);
    check.max_error = std::max(check.max_error, error);
    if (!(error <= tolerance * magnitude * inv_n + 1e-30)) {
      problem(detail::concat("index ", index, ": update ", update[index], ", expected ", expected,
                             " (", count - returned, " rank(s) applied)"));
    }
    next = size_t{index} + 1;
  }
  expect_zero_until(update.size());
  return check;
}

}  // namespace dgc
