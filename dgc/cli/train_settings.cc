// dgc train's experiment settings (train_command.h): what one-off experiments change, behind one
// repeatable --set KEY=VALUE instead of a flag each. The keys are the names of the run's settings
// lines (train::describe), so a key reads the same in a command and in a checkpoint.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "dgc/cli/train_command.h"
#include "dgc/core/error.h"

namespace dgc::cli {
namespace {

// One --set key: what it takes (for --help and errors), the flag that sets the same thing (given
// both, the command is refused), and how its value is applied.
struct Setting {
  const char* key;
  std::string values;
  const char* flag;  // nullptr: only --set
  std::function<void(const std::string& value, TrainCommand&, train::TrainOptions&)> apply;
};

template <typename E, size_t N>
std::string choices(const EnumNames<E, N>& names) {
  std::string text;
  for (const auto& name : names_of(names)) text += (text.empty() ? "" : "|") + name;
  return text;
}

// The value as one of the table's names (checked), into the command's field of that name.
template <typename E, size_t N>
auto named(const EnumNames<E, N>& names, const char* what, std::string TrainCommand::*field) {
  return [&names, what, field](const std::string& value, TrainCommand& cmd, train::TrainOptions&) {
    parse_name(names, value, what);
    cmd.*field = value;
  };
}

double number(const std::string& key, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    throw InvalidArgument("--set " + key + "=" + text + ": not a number");
  }
  return value;
}

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
      {"lr_in_velocity", "0|1", "--lr-in-velocity",
       [](const std::string& value, TrainCommand&, train::TrainOptions& o) {
         DGC_CHECK(value == "0" || value == "1", "--set lr_in_velocity takes 0 or 1, got '", value,
                   "'");
         o.optimizer.lr_in_velocity = value == "1";
       }},
      {"clip_scaling", choices(kClipScalingNames), "--clip-scaling",
       named(kClipScalingNames, "clip scaling", &TrainCommand::clip_scaling)},
      {"dense_path", choices(train::kDensePathNames), "--dense-path",
       named(train::kDensePathNames, "dense path", &TrainCommand::dense_path)},
      {"lr_decay", choices(kLrDecayNames), "--lr-decay",
       named(kLrDecayNames, "lr decay", &TrainCommand::lr_decay)},
      {"lr_step_epochs", "E1[,E2,E3,E4]", nullptr,
       [](const std::string& value, TrainCommand&, train::TrainOptions& o) {
         double* epochs = o.optimizer.lr.step_epochs;
         std::fill(epochs, epochs + 4, 0.0);
         size_t count = 0;
         for (size_t begin = 0; begin <= value.size(); ++count) {
           const size_t end = std::min(value.find(',', begin), value.size());
           DGC_CHECK(count < 4, "--set lr_step_epochs takes at most 4 epochs, got '", value, "'");
           epochs[count] = number("lr_step_epochs", value.substr(begin, end - begin));
           DGC_CHECK(epochs[count] > (count > 0 ? epochs[count - 1] : 0.0),
                     "--set lr_step_epochs takes increasing positive epochs, got '", value, "'");
           begin = end + 1;
         }
       }},
      {"lr_step_gamma", "G in (0, 1]", nullptr,
       [](const std::string& value, TrainCommand&, train::TrainOptions& o) {
         o.optimizer.lr.step_gamma = number("lr_step_gamma", value);
         DGC_CHECK(o.optimizer.lr.step_gamma > 0.0 && o.optimizer.lr.step_gamma <= 1.0,
                   "--set lr_step_gamma takes a factor in (0, 1], got ", value);
       }},
  };
  return table;
}

std::string known_keys() {
  std::string text;
  for (const auto& s : settings()) text += (text.empty() ? "" : ", ") + std::string(s.key);
  return text;
}

}  // namespace

std::string settings_help() {
  std::string text;
  for (const auto& s : settings()) {
    text += (text.empty() ? "" : ", ") + std::string(s.key) + "=" + s.values;
  }
  return text;
}

std::vector<std::string> apply_settings(TrainCommand& cmd, const CLI::App& sub,
                                        train::TrainOptions& options) {
  std::vector<std::string> given;
  for (const std::string& item : cmd.settings) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw InvalidArgument("--set takes KEY=VALUE, got '" + item +
                            "' (known keys: " + known_keys() + ")");
    }
    const std::string key = item.substr(0, eq);
    const auto setting = std::find_if(settings().begin(), settings().end(),
                                      [&](const Setting& s) { return key == s.key; });
    if (setting == settings().end()) {
      throw InvalidArgument("unknown --set key '" + key + "': the known keys are " + known_keys() +
                            " (docs/training.md, \"Experiment settings\")");
    }
    if (setting->flag != nullptr && sub.count(setting->flag) > 0) {
      throw InvalidArgument(detail::concat("--set ", key, " and ", setting->flag,
                                           " set the same thing: give one of them"));
    }
    setting->apply(item.substr(eq + 1), cmd, options);
    given.push_back(key);
  }
  return given;
}

}  // namespace dgc::cli
