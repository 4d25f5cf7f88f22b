// dgc train's tasks (train_command.h): the one table of tasks, and the one table of the settings
// whose default is the task's, which both applies those defaults and writes them into --help.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "dgc/cli/train_command.h"
#include "dgc/core/error.h"
#include "dgc/train/tasks/image.h"

namespace dgc::cli {
namespace {

std::string text_of(const std::string& value) { return value; }
std::string text_of(bool value) { return value ? "on" : "off"; }
std::string text_of(train::SelectionScope value) { return train::to_string(value); }
std::string text_of(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}
std::string text_of(int64_t value) { return std::to_string(value); }
std::string text_of(int value) { return std::to_string(value); }
std::string text_of(train::LrScaling value) { return train::to_string(value); }

// A setting whose default is the task's: its flag, its text in --help, and how it is applied.
struct TaskDefaulted {
  const char* flag;
  std::function<std::string(const train::TaskDefaults&)> text;
  std::function<void(const train::TaskDefaults&, train::TrainOptions&)> apply;
};

// `field` of TaskDefaults goes to the option `target` returns.
template <typename T, typename Target>
TaskDefaulted defaulted(const char* flag, T train::TaskDefaults::*field, Target target) {
  return {flag, [field](const train::TaskDefaults& d) { return text_of(d.*field); },
          [field, target](const train::TaskDefaults& d, train::TrainOptions& o) {
            target(o) = d.*field;
          }};
}

const std::vector<TaskDefaulted>& task_defaulted() {
  using train::TaskDefaults;
  using train::TrainOptions;
  static const std::vector<TaskDefaulted> table = {
      defaulted(
          "--model", &TaskDefaults::model, [](TrainOptions & o) -> auto& { return o.model; }),
      defaulted(
          "--epochs", &TaskDefaults::epochs, [](TrainOptions & o) -> auto& { return o.epochs; }),
      defaulted(
          "--batch-size", &TaskDefaults::batch_size,
          [](TrainOptions & o) -> auto& { return o.batch_size; }),
      defaulted(
          "--lr", &TaskDefaults::lr, [](TrainOptions & o) -> auto& { return o.optimizer.lr.base; }),
      defaulted(
          "--weight-decay", &TaskDefaults::weight_decay,
          [](TrainOptions & o) -> auto& { return o.optimizer.weight_decay; }),
      defaulted(
          "--clip-norm", &TaskDefaults::clip_norm,
          [](TrainOptions & o) -> auto& { return o.optimizer.clip_norm; }),
      defaulted(
          "--masking", &TaskDefaults::masking,
          [](TrainOptions & o) -> auto& { return o.optimizer.compressor.momentum.masking; }),
      defaulted(
          "--lr-scaling", &TaskDefaults::lr_scaling,
          [](TrainOptions & o) -> auto& { return o.lr_scaling; }),
      {"--lr-batch",
       [](const TaskDefaults& d) {
         return d.lr_reference_batch > 0 ? text_of(d.lr_reference_batch) : std::string("-");
       },
       [](const TaskDefaults& d, TrainOptions& o) { o.lr_reference_batch = d.lr_reference_batch; }},
      {"--lr-batch-limit",
       [](const TaskDefaults& d) {
         return d.lr_batch_limit > 0 ? text_of(d.lr_batch_limit) : std::string("-");
       },
       [](const TaskDefaults& d, TrainOptions& o) { o.lr_batch_limit = d.lr_batch_limit; }},
      // A dense run selects nothing: its scope stays the shared default.
      {"--selection-scope",
       [](const TaskDefaults& d) { return text_of(d.selection_scope) + " with DGC"; },
       [](const TaskDefaults& d, TrainOptions& o) {
         if (o.optimizer.compression == train::Compression::kDgc) {
           o.optimizer.selection_scope = d.selection_scope;
         }
       }},
  };
  return table;
}

}  // namespace

bool flag_given(const CLI::App& sub, const std::string& flag) {
  for (const std::string& name : {flag, "--no-" + flag.substr(2)}) {
    const CLI::Option* option = sub.get_option_no_throw(name);
    if (option != nullptr && option->count() > 0) return true;
  }
  return false;
}

const std::vector<TaskEntry>& task_entries() {
  static const std::vector<TaskEntry> entries = {
      {"image",
       {"--model", "--data"},
       train::image_task_defaults,
       [](const TrainCommand& c) { return train::load_image_task(c.data); }},
      {"lm",
       {"--cache-dir", "--vocabulary", "--embedding", "--hidden", "--bptt", "--dropout"},
       train::lm_task_defaults,
       [](const TrainCommand& c) { return train::load_lm_task(c.lm); }},
      {"speech",
       {"--cache-dir", "--corpus-seed", "--corpus-train", "--corpus-test", "--gru-hidden",
        "--gru-layers", "--frame-stack"},
       train::speech_task_defaults,
       [](const TrainCommand& c) {
         auto options = c.speech;
         options.corpus.cache_dir = c.lm.cache_dir;  // --cache-dir: one root for every corpus
         return train::load_speech_task(options, /*progress=*/true);
       }},
  };
  return entries;
}

const TaskEntry& task_entry(const std::string& name) {
  for (const auto& entry : task_entries()) {
    if (entry.name == name) return entry;
  }
  throw InvalidArgument("unknown --task " + name);
}

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& entry : task_entries()) names.emplace_back(entry.name);
  return names;
}

void check_task_flags(const TrainCommand& cmd, const CLI::App& sub) {
  const std::vector<std::string>& own = task_entry(cmd.task).flags;
  for (const auto& entry : task_entries()) {
    if (entry.name == cmd.task) continue;
    for (const auto& flag : entry.flags) {
      if (std::find(own.begin(), own.end(), flag) == own.end() && sub.count(flag) > 0) {
        throw InvalidArgument(detail::concat(flag, " belongs to --task ", entry.name,
                                             ", not to --task ", cmd.task,
                                             ": drop it or add --task ", entry.name));
      }
    }
  }
}

std::string task_defaults_help(const std::string& flag) {
  for (const auto& setting : task_defaulted()) {
    if (setting.flag != flag) continue;
    // Tasks with the same default share one entry: "default: 4 (image, lm), 10 (speech)".
    std::vector<std::pair<std::string, std::string>> groups;  // value, tasks
    for (const auto& entry : task_entries()) {
      const std::string value = setting.text(entry.defaults());
      auto group = std::find_if(groups.begin(), groups.end(),
                                [&](const auto& g) { return g.first == value; });
      if (group == groups.end()) {
        groups.emplace_back(value, entry.name);
      } else {
        group->second += std::string(", ") + entry.name;
      }
    }
    if (groups.size() == 1) return "default: " + groups.front().first;
    std::string text = "default: ";
    for (size_t i = 0; i < groups.size(); ++i) {
      text += (i > 0 ? ", " : "") + groups[i].first + " (" + groups[i].second + ")";
    }
    return text;
  }
  return "";
}

void apply_task_defaults(const train::TaskDefaults& defaults, const CLI::App& sub,
                         train::TrainOptions& options) {
  for (const auto& setting : task_defaulted()) {
    if (!flag_given(sub, setting.flag)) setting.apply(defaults, options);
  }
}

}  // namespace dgc::cli
