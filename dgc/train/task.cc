#include "dgc/train/task.h"

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

}  // namespace dgc::train
