#include "dgc/train/task.h"

#include <algorithm>
#include <cstdio>

#include "dgc/core/error.h"
#include "dgc/train/trainer.h"

namespace dgc::train {

TaskDefaults shared_task_defaults() {
  const TrainOptions o;
  return {.model = o.model,
          .epochs = o.epochs,
          .batch_size = o.batch_size,
          .lr = o.optimizer.lr.base,
          .weight_decay = o.optimizer.weight_decay,
          .clip_norm = o.optimizer.clip_norm,
          .masking = o.optimizer.compressor.momentum.masking,
          .selection_scope = o.optimizer.selection_scope,
          .lr_scaling = o.lr_scaling,
          .lr_reference_batch = o.lr_reference_batch,
          .lr_batch_limit = o.lr_batch_limit};
}

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
