// dgc train's command line, in the files of one topic each:
//   train_flags.cc     the flags, one to one onto TrainCommand (and through it the options
//   structs); train_tasks.cc     the tasks: their flags, how each is built, and the settings whose
//   default is
//                      the task's (TaskDefaults), applied and shown in --help from one table;
//   train_settings.cc  the experiment settings behind --set KEY=VALUE;
//   train_options.cc   the checks across flags, and the TrainOptions a run gets;
//   train.cc           the run: connect, train (train::Trainer), print.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dgc/train/data.h"
#include "dgc/train/task.h"
#include "dgc/train/tasks/lm.h"
#include "dgc/train/tasks/speech.h"
#include "dgc/train/trainer.h"

namespace dgc::cli {

// What the flags fill in. The enums travel as their names (checked against their tables by
// the flags) and are parsed by resolve_options.
struct TrainCommand {
  train::TrainOptions options;
  std::string task = "image";
  train::LmOptions lm;
  train::SpeechOptions speech;
  std::string data = train::kDefaultDataDir;
  int workers = 4;
  std::string backend = "auto";
  std::string rendezvous;
  std::string compression =
      name_of(train::kCompressionNames, train::OptimizerOptions{}.compression);
  std::string selection =
      name_of(kSelectionMethodNames, train::OptimizerOptions{}.compressor.selection.method);
  std::string value_type = to_string(train::OptimizerOptions{}.compressor.value_type);
  std::string clip_scaling = to_string(train::OptimizerOptions{}.clip_scaling);
  std::string exchange = to_string(train::OptimizerOptions{}.exchange);
  std::string dense_path = train::to_string(train::OptimizerOptions{}.dense_path);
  std::string selection_scope = train::to_string(train::OptimizerOptions{}.selection_scope);
  std::string on_nonfinite = train::to_string(train::OptimizerOptions{}.on_nonfinite);
  std::string lr_decay = name_of(kLrDecayNames, train::OptimizerOptions{}.lr.decay);
  std::string lr_scaling = name_of(train::kLrScalingNames, train::TrainOptions{}.lr_scaling);
  std::vector<std::string> settings;  // --set KEY=VALUE, in order
  std::string metrics;
  std::string resume;  // --resume [auto]: "" for the plain flag
  std::string progress = "auto";
  double timeout_seconds = 60.0;
  std::string job_secret_file;
};

// True if the command line gave `flag` ("--lr"), or for a switch its "--no-" form.
bool flag_given(const CLI::App& sub, const std::string& flag);

// --- train_tasks.cc -------------------------------------------------------------------------

// A task: its name, the flags only it has, its defaults, and how the command builds it.
struct TaskEntry {
  const char* name;
  std::vector<std::string> flags;
  train::TaskDefaults (*defaults)();
  std::function<std::unique_ptr<train::Task>(const TrainCommand&)> make;
};
const std::vector<TaskEntry>& task_entries();
const TaskEntry& task_entry(const std::string& name);  // throws dgc::InvalidArgument if unknown
std::vector<std::string> task_names();

// Rejects the flags of other tasks than cmd.task (a flag several tasks share is fine for each).
void check_task_flags(const TrainCommand& cmd, const CLI::App& sub);

// The defaults of `flag` per task, for its --help: "default: 32 (image), 10 (lm), 4 (speech)";
// "" for a flag whose default is no task's.
std::string task_defaults_help(const std::string& flag);

// Sets, for each setting whose default is the task's and whose flag the command line did not
// give, the task's default. Runs after the flags are parsed into `options` (compression
// included: the selection scope is a DGC run's).
void apply_task_defaults(const train::TaskDefaults& defaults, const CLI::App& sub,
                         train::TrainOptions& options);

// --- train_settings.cc ----------------------------------------------------------------------

// The --set keys with what each takes, for --help.
std::string settings_help();

// Applies cmd.settings in order to `cmd` and `options`; returns the keys given. Throws
// dgc::InvalidArgument for a malformed KEY=VALUE, an unknown key (listing the known ones), a bad
// value, or a key given beside the flag that sets the same thing.
std::vector<std::string> apply_settings(TrainCommand& cmd, const CLI::App& sub,
                                        train::TrainOptions& options);

// --- train_flags.cc -------------------------------------------------------------------------

// Adds every flag of `dgc train` to `sub`, bound to `cmd` (which must outlive `sub`).
void add_train_flags(CLI::App& sub, TrainCommand& cmd);

// --- train_options.cc -----------------------------------------------------------------------

// The options of the run: the flags, the task's defaults for the flags not given, the --set
// settings, each checked once here. Throws dgc::InvalidArgument naming the flag and the remedy.
train::TrainOptions resolve_options(TrainCommand& cmd, const CLI::App& sub);

}  // namespace dgc::cli
