#include "dgc/train/task.h"

#include <algorithm>
#include <cstdio>

#include "dgc/core/error.h"

namespace dgc::train {

double metric_value(const std::vector<Metric>& metrics, const std::string& name) {
  std::string names;
  for (const auto& m : metrics) {
    if (m.name == name) return m.value;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  throw InvalidArgument("no metric '" + name + "' among the task's metrics (" + names + ")");
}

std::string format_number(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), pattern, value);
  return text;
}

int64_t used_count(int64_t available, int64_t limit) {
  return limit > 0 ? std::min(available, limit) : available;
}

}  // namespace dgc::train
