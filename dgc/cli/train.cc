// dgc train: data-parallel training of a task -- image classification on Fashion-MNIST (--task
// image, the default), a word-level LSTM language model on the King James Bible (--task lm) or a
// GRU-CTC speech recogniser on letters and digits spoken by espeak-ng (--task speech) -- with DGC
// or dense.
//
// Launch: through comm::connect(), as every dgc command: N local worker threads (default),
// `mpirun -np N dgc train` (MPI, or Gloo with --rendezvous DIR), torchrun, or the four variables
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by any other launcher.
// Flags map one to one onto dgc::train::TrainOptions / OptimizerOptions and the task's options;
// defaults are theirs, except the few a task overrides (LmTrainDefaults, SpeechTrainDefaults) when
// the flag is absent.
// A flag of one task given with another task is an error.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/commands.h"
#include "dgc/comm/launch.h"
#include "dgc/core/auth.h"
#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/data.h"
#include "dgc/train/progress.h"
#include "dgc/train/tasks/image.h"
#include "dgc/train/tasks/lm.h"
#include "dgc/train/tasks/speech.h"
#include "dgc/train/trainer.h"

namespace dgc::cli {
namespace {

using train::format_bytes;
using train::format_duration;

struct TrainCommand {
  train::TrainOptions options;
  std::string task = "image";
  train::LmOptions lm;
  train::SpeechOptions speech;
  std::string data = train::kDefaultDataDir;
  int workers = 4;
  std::string backend = "auto";
  std::string rendezvous;
  std::string compression = "dgc";
  std::string selection = "sampled";
  std::string value_type = "fp32";
  std::string clip_scaling = "paper";
  std::string exchange = "allgather";
  std::string dense_path = train::to_string(train::OptimizerOptions{}.dense_path);
  std::string selection_scope = train::to_string(train::OptimizerOptions{}.selection_scope);
  std::string on_nonfinite = train::to_string(train::OptimizerOptions{}.on_nonfinite);
  std::string lr_decay = "cosine";
  std::string metrics;
  std::string resume;  // --resume [auto]: "" for the plain flag
  std::string progress = "auto";
  double timeout_seconds = 60.0;
  std::string job_secret_file;
};

SelectionMethod parse_selection(const std::string& name) {
  if (name == "sampled") return SelectionMethod::kSampled;
  if (name == "exact") return SelectionMethod::kExact;
  throw InvalidArgument("unknown --selection '" + name + "': expected sampled or exact");
}

LearningRateSchedule::Decay parse_decay(const std::string& name) {
  if (name == "cosine") return LearningRateSchedule::Decay::kCosine;
  if (name == "constant") return LearningRateSchedule::Decay::kConstant;
  throw InvalidArgument("unknown --lr-decay '" + name + "': expected cosine or constant");
}

// An on/off setting as two flags, --NAME and --no-NAME; the last one given wins. (CLI11's
// "--NAME,!--no-NAME" prints "{false}" beside the pair, which reads as the default; the help
// says the default instead.)
void add_switch(CLI::App& sub, const std::string& name, bool& target, const std::string& help) {
  sub.add_flag_callback(
      "--" + name, [&target] { target = true; }, help);
  sub.add_flag_callback(
      "--no-" + name, [&target] { target = false; }, "Turn --" + name + " off");
}

bool switch_given(const CLI::App& sub, const std::string& name) {
  return sub.count("--" + name) + sub.count("--no-" + name) > 0;
}

double ratio(uint64_t dense, uint64_t message) {
  return message > 0 ? static_cast<double>(dense) / static_cast<double>(message) : 0.0;
}

// The tasks: name, the flags only that task has, and how the command builds it.
struct TaskEntry {
  const char* name;
  std::vector<std::string> flags;
  std::function<std::unique_ptr<train::Task>(const TrainCommand&)> make;
};

const std::vector<TaskEntry>& task_entries() {
  static const std::vector<TaskEntry> entries = {
      {"image",
       {"--model", "--data"},
       [](const TrainCommand& c) { return train::load_image_task(c.data); }},
      {"lm",
       {"--cache-dir", "--vocabulary", "--embedding", "--hidden", "--bptt", "--dropout"},
       [](const TrainCommand& c) { return train::load_lm_task(c.lm); }},
      {"speech",
       {"--cache-dir", "--corpus-seed", "--corpus-train", "--corpus-test", "--gru-hidden",
        "--gru-layers", "--frame-stack"},
       [](const TrainCommand& c) {
         auto options = c.speech;
         options.corpus.cache_dir = c.lm.cache_dir;  // --cache-dir: one root for every corpus
         return train::load_speech_task(options, /*progress=*/true);
       }},
  };
  return entries;
}

// Rejects the flags of other tasks than cmd.task (a flag several tasks share is fine for each).
void check_task_flags(const TrainCommand& cmd, const CLI::App& sub) {
  std::vector<std::string> own;
  for (const auto& entry : task_entries()) {
    if (entry.name == cmd.task) own = entry.flags;
  }
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

nlohmann::json to_json(const train::EpochMetrics& m, const std::string& compression, int workers) {
  nlohmann::json json = {{"epoch", m.epoch}, {"train_loss", m.train_loss}};
  for (const auto& metric : m.evaluation) json[metric.name] = metric.value;
  if (m.resumed_at > 0) json["resumed_at_iteration"] = m.resumed_at;
  json.update({{"lr", m.lr},
               {"density", m.density},
               {"iterations", m.iterations},
               {"skipped_steps", m.skipped_steps},
               {"message_bytes", m.bytes.message},
               {"message_bytes_compressed", m.bytes.message_compressed},
               {"message_bytes_dense_path", m.bytes.message_dense_path},
               {"message_bytes_headers", m.bytes.message_headers},
               {"dense_gradient_bytes", m.bytes.dense_gradient},
               {"compression_ratio", m.compression_ratio},
               {"wire_bytes_sent", m.bytes.wire_sent},
               {"dense_wire_bytes", m.bytes.dense_wire_sent},
               {"seconds", m.seconds},
               {"train_seconds", m.train_seconds},
               {"exchange_seconds", m.exchange_seconds},
               {"compression", compression},
               {"workers", workers}});
  return json;
}

void run(const TrainCommand& cmd, const CLI::App& sub) {
  const auto command_start = std::chrono::steady_clock::now();
  const bool workers_given = sub.count("--workers") > 0;
  check_task_flags(cmd, sub);
  train::TrainOptions options = cmd.options;
  auto& opt = options.optimizer;
  if (cmd.task == "lm") {
    options.model = "lstm";
    using D = train::LmTrainDefaults;
    if (sub.count("--lr") == 0) opt.lr.base = D::kLr;
    if (sub.count("--clip-norm") == 0) opt.clip_norm = D::kClipNorm;
    if (sub.count("--weight-decay") == 0) opt.weight_decay = D::kWeightDecay;
    if (sub.count("--batch-size") == 0) options.batch_size = D::kBatchSize;
    if (!switch_given(sub, "masking")) opt.compressor.momentum.masking = D::kMasking;
  } else if (cmd.task == "speech") {
    options.model = "gru";
    using D = train::SpeechTrainDefaults;
    if (sub.count("--lr") == 0) opt.lr.base = D::kLr;
    if (sub.count("--clip-norm") == 0) opt.clip_norm = D::kClipNorm;
    if (sub.count("--weight-decay") == 0) opt.weight_decay = D::kWeightDecay;
    if (sub.count("--batch-size") == 0) options.batch_size = D::kBatchSize;
    if (sub.count("--epochs") == 0) options.epochs = D::kEpochs;
  }
  opt.compression = train::parse_compression(cmd.compression);
  opt.compressor.selection.method = parse_selection(cmd.selection);
  opt.compressor.value_type = parse_value_type(cmd.value_type);
  opt.clip_scaling = parse_clip_scaling(cmd.clip_scaling);
  opt.exchange = parse_exchange_algorithm(cmd.exchange);
  opt.dense_path = train::parse_dense_path(cmd.dense_path);
  // lm selects globally unless told otherwise (LmTrainDefaults); a dense run has no selection.
  const bool scope_given = sub.count("--selection-scope") > 0;
  opt.selection_scope = train::parse_selection_scope(cmd.selection_scope);
  if (!scope_given && cmd.task == "lm" && opt.compression == train::Compression::kDgc) {
    opt.selection_scope = train::LmTrainDefaults::kSelectionScope;
  }
  if (opt.selection_scope == train::SelectionScope::kGlobal) {
    if (opt.compression != train::Compression::kDgc) {
      throw InvalidArgument(
          "--selection-scope global is how DGC selects (dense training sends everything): use it "
          "with --compression dgc, or drop it");
    }
    for (const char* flag :
         {"--dense-path", "--dense-path-density", "--min-compress-numel", "--compress-1d"}) {
      if (sub.count(flag) > 0) {
        throw InvalidArgument(
            detail::concat(flag,
                           " chooses how the tensors left out of compression travel, and with "
                           "--selection-scope global",
                           scope_given ? "" : " (the lm default)",
                           " none is: every tensor is selected at --density; drop ", flag,
                           " or add --selection-scope tensor"));
      }
    }
  }
  opt.on_nonfinite = train::parse_nonfinite_policy(cmd.on_nonfinite);
  if (sub.count("--max-consecutive-skips") > 0 &&
      opt.on_nonfinite != train::NonFinitePolicy::kSkip) {
    throw InvalidArgument(
        "--max-consecutive-skips bounds --on-nonfinite skip: add --on-nonfinite skip, or drop it");
  }
  opt.lr.decay = parse_decay(cmd.lr_decay);
  if (opt.lr_in_velocity && opt.compression != train::Compression::kDgc) {
    throw InvalidArgument(
        "--lr-in-velocity changes how DGC accumulates (dense training has no velocity): use it "
        "with --compression dgc, or drop it");
  }
  opt.compressor.seed = options.seed;
  DGC_CHECK(cmd.timeout_seconds > 0, "--timeout must be positive");
  opt.timeout = comm::Timeout(static_cast<int64_t>(cmd.timeout_seconds * 1000));
  if (sub.count("--resume") > 0) {
    if (cmd.resume != "" && cmd.resume != "auto") {
      throw InvalidArgument("--resume takes no value or 'auto', not '" + cmd.resume + "'");
    }
    if (cmd.resume == "auto" && sub.count("--resume-step") > 0) {
      throw InvalidArgument("--resume auto picks the step itself: drop --resume-step");
    }
    options.resume_auto = cmd.resume == "auto";
    options.resume = !options.resume_auto;
  }
  if (sub.count("--resume-step") > 0) options.resume = true;
  if (options.resume_auto && options.checkpoint.empty()) {
    throw InvalidArgument(
        "--resume auto needs --checkpoint PATH (where the run writes and finds "
        "its checkpoints)");
  }
  if (options.resume && options.checkpoint.empty()) {
    throw InvalidArgument("--resume needs --checkpoint PATH (the prefix the run wrote)");
  }
  if (options.checkpoint.empty() &&
      (sub.count("--checkpoint-every") > 0 || sub.count("--checkpoint-keep") > 0)) {
    throw InvalidArgument("--checkpoint-every and --checkpoint-keep need --checkpoint PATH");
  }

  // How to connect: the same rules and messages as every dgc command (comm::connect).
  const comm::LaunchEnv env = comm::detect_launch();
  comm::ConnectOptions connect_options;
  if (cmd.backend != "auto") connect_options.backend = comm::parse_backend(cmd.backend);
  const bool local = env.kind == comm::LaunchEnv::Kind::kLocal;
  connect_options.workers = local || workers_given ? cmd.workers : 0;
  connect_options.rendezvous = cmd.rendezvous;
  connect_options.gloo.timeout = opt.timeout;
  // The job secret (a private file or DGC_JOB_SECRET, never the command line) becomes the
  // rendezvous and exchange keys; the secret itself is wiped at once.
  if (auto secret = load_job_secret(cmd.job_secret_file, std::getenv(kJobSecretEnv))) {
    const JobKeys keys = derive_job_keys(*secret);
    wipe(*secret);
    connect_options.gloo.rendezvous_key = keys.rendezvous;
    opt.message_key = keys.exchange;
  }
  comm::check_launch(env, connect_options);
  const int workers = local ? cmd.workers : env.world_size;
  if (options.threads == 0) options.threads = comm::threads_per_worker(env, cmd.workers);

  std::unique_ptr<train::Task> task;
  for (const auto& entry : task_entries()) {
    if (entry.name == cmd.task) task = entry.make(cmd);
  }
  DGC_CHECK(task != nullptr, "unknown --task ", cmd.task);

  // Under a launcher stdout is often a pseudo-terminal that ends up in a log: lines there.
  const bool terminal = cmd.progress == "bar" ||
                        (cmd.progress == "auto" && env.kind == comm::LaunchEnv::Kind::kLocal &&
                         isatty(fileno(stdout)) != 0);
  std::mutex print_mutex;  // rank 0 prints; errors may come from any thread
  train::ProgressPrinter printer(stdout, terminal);
  std::unique_ptr<std::ofstream> metrics_file;

  auto run_rank = [&](comm::Communicator& comm) {
    const auto connected = std::chrono::steady_clock::now();
    train::TrainCallbacks callbacks;
    if (comm.rank() == 0) {
      if (!cmd.metrics.empty()) {
        metrics_file = std::make_unique<std::ofstream>(
            cmd.metrics, options.resume || options.resume_auto ? std::ios::app : std::ios::trunc);
        if (!*metrics_file) throw DataError("cannot open --metrics file " + cmd.metrics);
      }
      callbacks.on_start = [&](const train::RunInfo& info) {
        std::printf(
            "dgc train: %s, %lld parameters (%lld in %lld compressed tensors, %lld dense "
            "tensors)\n"
            "  %d workers (%s, %s, %d libtorch threads each), batch %lld per worker, %lld "
            "iterations per epoch, %d epochs\n",
            options.model.c_str(), static_cast<long long>(info.parameters),
            static_cast<long long>(info.compressed_parameters),
            static_cast<long long>(info.compressed_tensors),
            static_cast<long long>(info.dense_tensors), info.world_size, env.description().c_str(),
            comm.backend().c_str(), options.threads, static_cast<long long>(options.batch_size),
            static_cast<long long>(info.iterations_per_epoch), options.epochs);
        if (opt.compression == train::Compression::kDgc) {
          const int64_t stage = info.warmup_stage_iterations > 0 ? info.warmup_stage_iterations
                                                                 : info.iterations_per_epoch;
          std::printf(
              "  compression dgc: density %g after a warm-up of %g epoch(s) (%lld iterations, "
              "stages of %lld iterations at density max(d, 0.25^(stage+1))), momentum factor "
              "masking %s\n",
              opt.density.after_warmup, opt.density.warmup_epochs,
              static_cast<long long>(info.warmup_iterations), static_cast<long long>(stage),
              opt.compressor.momentum.masking ? "on" : "off");
          if (opt.selection_scope == train::SelectionScope::kGlobal) {
            std::printf(
                "  selection global: one threshold over all %lld elements of the %lld tensors, "
                "the top d of the whole model\n",
                static_cast<long long>(info.parameters),
                static_cast<long long>(info.dense_tensors));
          } else if (info.dense_tensors > 0) {
            std::printf("  dense path %s", cmd.dense_path.c_str());
            if (opt.dense_path == train::DensePath::kGrouped) {
              std::printf(": %lld elements in %lld tensors compressed as one at density %g",
                          static_cast<long long>(info.parameters - info.compressed_parameters),
                          static_cast<long long>(info.dense_tensors), opt.dense_path_density);
            }
            std::printf("\n");
          }
        } else {
          std::printf("  compression none (dense baseline)\n");
        }
        std::string clip;
        if (opt.clip_norm > 0 && opt.compression == train::Compression::kDgc) {
          clip = detail::concat(", clip norm ", opt.clip_norm, " (", to_string(opt.clip_scaling),
                                " scaling: each worker's gradient at ",
                                local_clip_limit(opt.clip_norm, workers, opt.clip_scaling), ")");
        } else if (opt.clip_norm > 0) {
          clip = detail::concat(", clip norm ", opt.clip_norm, " (the averaged gradient)");
        }
        std::printf(
            "  lr %g (%s, %g warm-up epochs%s), momentum %g%s, weight decay %g%s\n", opt.lr.base,
            cmd.lr_decay.c_str(), opt.lr.warmup_epochs,
            opt.lr_in_velocity ? ", inside the velocity" : "", opt.compressor.momentum.factor,
            opt.compressor.momentum.nesterov ? " (Nesterov)" : "", opt.weight_decay, clip.c_str());
        std::printf("  job %s: %s\n", info.run_id.c_str(),
                    info.authenticated
                        ? "messages and rendezvous values authenticated (HMAC-SHA256, job secret)"
                        : "messages not authenticated (no job secret: set DGC_JOB_SECRET or "
                          "--job-secret-file)");
        if (options.resume_auto && info.resumed_from.empty()) {
          std::printf("  no checkpoint under %s yet: a new run (--resume auto)\n",
                      options.checkpoint.c_str());
        }
        if (!info.resumed_from.empty()) {
          const int64_t inside = info.start_iteration -
                                 static_cast<int64_t>(info.start_epoch) * info.iterations_per_epoch;
          if (inside > 0) {
            std::printf(
                "  resumed from %s: step %lld, inside epoch %d after %lld of its %lld "
                "iterations\n",
                info.resumed_from.c_str(), static_cast<long long>(info.start_iteration),
                info.start_epoch + 1, static_cast<long long>(inside),
                static_cast<long long>(info.iterations_per_epoch));
          } else {
            std::printf("  resumed from %s: step %lld, after epoch %d\n", info.resumed_from.c_str(),
                        static_cast<long long>(info.start_iteration), info.start_epoch);
          }
          // Where a restart's time goes (docs/reliability.md, "Restarts under torchrun").
          const auto seconds = [](auto a, auto b) {
            return std::chrono::duration<double>(b - a).count();
          };
          std::printf(
              "  training again %.2f s after the command started: data and connect %.2f s, "
              "checkpoint %.2f s\n",
              seconds(command_start, std::chrono::steady_clock::now()),
              seconds(command_start, connected), info.resume_seconds);
        }
        std::fflush(stdout);
      };
      callbacks.on_progress = [&](const train::Progress& p) {
        std::lock_guard<std::mutex> lock(print_mutex);
        printer.update(p);
      };
      callbacks.on_skipped_step = [&](const train::SkippedStep& k) {
        std::lock_guard<std::mutex> lock(print_mutex);
        printer.break_line();
        std::fprintf(
            stderr,
            "dgc train: skipped iteration %lld (epoch %d): non-finite gradient on %d of %d "
            "rank(s), nothing applied (%lld skipped so far)\n",
            static_cast<long long>(k.iteration), k.epoch, k.bad_ranks, k.world_size,
            static_cast<long long>(k.skipped_steps));
        std::fflush(stderr);
      };
      callbacks.on_epoch = [&](const train::EpochMetrics& m) {
        std::lock_guard<std::mutex> lock(print_mutex);
        printer.epoch(m);
        if (metrics_file) {
          *metrics_file << to_json(m, cmd.compression, workers).dump() << "\n";
          metrics_file->flush();
        }
      };
    }
    try {
      train::Trainer trainer(comm, options, *task);
      const auto s = trainer.run(callbacks);
      if (comm.rank() != 0) return;
      std::lock_guard<std::mutex> lock(print_mutex);
      printer.break_line();
      std::string headline;
      for (const auto& metric : s.evaluation) {
        if (metric.name == task->headline()) headline = metric.text;
      }
      std::printf("result: %s after %d epochs (%s, %d workers, compression %s)\n", headline.c_str(),
                  options.epochs, options.model.c_str(), s.world_size, cmd.compression.c_str());
      std::printf("  sent per worker: %s; dense would have sent %s\n",
                  format_bytes(static_cast<double>(s.total.message)).c_str(),
                  format_bytes(static_cast<double>(s.total.dense_gradient)).c_str());
      if (s.post_warmup.message > 0) {
        std::printf("  compression ratio: %.1fx whole run, %.1fx after warm-up\n",
                    ratio(s.total.dense_gradient, s.total.message),
                    ratio(s.post_warmup.dense_gradient, s.post_warmup.message));
        // Every step's dense gradient is 4 bytes per parameter.
        const double steps = static_cast<double>(s.post_warmup.dense_gradient) /
                             (4.0 * static_cast<double>(s.parameters));
        std::printf(
            "  message per step after warm-up: %.0f bytes (compressed tensors %.0f, dense path "
            "%.0f, headers %.0f)\n",
            static_cast<double>(s.post_warmup.message) / steps,
            static_cast<double>(s.post_warmup.message_compressed) / steps,
            static_cast<double>(s.post_warmup.message_dense_path) / steps,
            static_cast<double>(s.post_warmup.message_headers) / steps);
      } else {
        std::printf("  compression ratio: %.1fx whole run (the run ended inside the warm-up)\n",
                    ratio(s.total.dense_gradient, s.total.message));
      }
      std::printf(
          "  on the wire per worker: sent %s, received %s (dense allreduce would send %s)\n",
          format_bytes(static_cast<double>(s.total.wire_sent)).c_str(),
          format_bytes(static_cast<double>(s.total.wire_received)).c_str(),
          format_bytes(static_cast<double>(s.total.dense_wire_sent)).c_str());
      if (opt.on_nonfinite == train::NonFinitePolicy::kSkip || s.skipped_steps > 0) {
        std::printf("  skipped steps (non-finite gradient): %lld\n",
                    static_cast<long long>(s.skipped_steps));
      }
      std::printf("  wall time: %s\n", format_duration(s.seconds).c_str());
      if (!options.checkpoint.empty()) {
        const auto steps = train::checkpoint_steps(options.checkpoint, 0);
        if (!steps.empty()) {
          std::printf("  last checkpoint: %s .. .rank%d (%zu kept per rank)\n",
                      train::checkpoint_path(options.checkpoint, steps.back(), 0).c_str(),
                      s.world_size - 1, steps.size());
        }
      }
      std::fflush(stdout);
    } catch (...) {
      if (comm.rank() == 0) {
        std::lock_guard<std::mutex> lock(print_mutex);
        printer.break_line();
      }
      throw;
    }
  };

  auto connection = comm::connect(env, connect_options);
  comm::run_ranks(connection, run_rank);
}

}  // namespace

void add_train(CLI::App& app) {
  auto cmd = std::make_shared<TrainCommand>();
  auto& o = cmd->options;
  auto& opt = o.optimizer;
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train a task with data-parallel SGD, compressed with DGC (--compression dgc) or dense "
      "(--compression none): an image classifier on Fashion-MNIST (--task image), a word-level "
      "LSTM language model on the King James Bible (--task lm) or a GRU-CTC recogniser of letters "
      "and digits spoken by espeak-ng (--task speech). Runs --workers local threads, or "
      "one worker per process under mpirun or with torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/"
      "MASTER_PORT.");

  sub->add_option("--task", cmd->task,
                  "image (Fashion-MNIST classification), lm (KJV language model) or speech "
                  "(spoken letters and digits, CTC); flags marked [image], [lm] or [speech] "
                  "belong to those tasks only")
      ->check(CLI::IsMember({"image", "lm", "speech"}))
      ->capture_default_str();
  sub->add_option("--cache-dir", cmd->lm.cache_dir,
                  "[lm, speech] Directory for the prepared corpora (default $XDG_CACHE_HOME/dgc or "
                  "~/.cache/dgc): the KJV, prepared from the `bible` program (bible-kjv) on first "
                  "use; the speech corpus, synthesised with espeak-ng on first use");
  sub->add_option("--corpus-seed", cmd->speech.corpus.seed,
                  "[speech] Seed of the speech corpus (words, voices; not the training seed)")
      ->capture_default_str();
  sub->add_option("--corpus-train", cmd->speech.corpus.train_utterances,
                  "[speech] Training utterances in the corpus (voices of the training variants)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub->add_option("--corpus-test", cmd->speech.corpus.test_utterances,
                  "[speech] Test utterances in the corpus (held-out variants; also a noisy copy)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub->add_option("--gru-hidden", cmd->speech.hidden, "[speech] GRU units per direction")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub->add_option("--gru-layers", cmd->speech.layers, "[speech] Bidirectional GRU layers")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  sub->add_option("--frame-stack", cmd->speech.stack,
                  "[speech] 10 ms feature frames stacked into one GRU step (and the stride)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  sub->add_option("--vocabulary", cmd->lm.vocabulary,
                  "[lm] Vocabulary size V: the most frequent training words, <unk> and <eos>")
      ->check(CLI::Range(int64_t{3}, int64_t{1} << 20))
      ->capture_default_str();
  sub->add_option("--embedding", cmd->lm.embedding, "[lm] Word embedding size E")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub->add_option("--hidden", cmd->lm.hidden, "[lm] LSTM hidden size H (2 layers)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub->add_option("--bptt", cmd->lm.bptt,
                  "[lm] Tokens per sequence (truncated back-propagation through time)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub->add_option("--dropout", cmd->lm.dropout, "[lm] Dropout probability")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();

  sub->add_option("--model", o.model, "[image] Model: cnn, mlp or resnet20 (lm: lstm; speech: gru)")
      ->check(CLI::IsMember({"cnn", "mlp", "resnet20"}))
      ->capture_default_str();
  sub->add_option("--data", cmd->data,
                  "[image] Directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "
                  "(Debian package dataset-fashion-mnist)")
      ->capture_default_str();
  sub->add_option("--workers", cmd->workers,
                  "Local worker threads (under mpirun/torchrun each process is one worker; if "
                  "given there, it must equal the world size)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--backend", cmd->backend, "auto (mpi under mpirun, gloo otherwise), gloo or mpi")
      ->check(CLI::IsMember({"auto", "gloo", "mpi"}))
      ->capture_default_str();
  sub->add_option("--rendezvous", cmd->rendezvous,
                  "Shared directory where Gloo ranks meet (one process per rank: under mpirun with "
                  "--backend gloo, or under torchrun instead of the TCP store)");
  sub->add_option("--timeout", cmd->timeout_seconds, "Timeout of every collective, seconds")
      ->capture_default_str();
  sub->add_option("--job-secret-file", cmd->job_secret_file,
                  "File (mode 600, the same on every rank) holding the job secret; or set "
                  "DGC_JOB_SECRET. With a secret, exchange messages and rendezvous values carry "
                  "HMAC-SHA256 tags and a rank with another secret is refused (docs/"
                  "reliability.md). Never give the secret itself on the command line");
  sub->add_option("--compression", cmd->compression, "dgc, or none for the dense baseline")
      ->check(CLI::IsMember({"dgc", "none"}))
      ->capture_default_str();
  sub->add_option("--density", opt.density.after_warmup,
                  "Fraction of each compressed tensor sent after warm-up (d)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  sub->add_option("--warmup-epochs", opt.density.warmup_epochs,
                  "Density warm-up: density max(d, 0.25^(s+1)) in warm-up stage s")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--warmup-stages", o.warmup_stages,
                  "The density warm-up's stages, spread evenly over --warmup-epochs (0: one stage "
                  "per epoch)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--momentum", opt.compressor.momentum.factor, "Momentum m")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  add_switch(*sub, "nesterov", opt.compressor.momentum.nesterov,
             std::string("Nesterov momentum (default: ") +
                 (opt.compressor.momentum.nesterov ? "on)" : "off)"));
  add_switch(*sub, "masking", opt.compressor.momentum.masking,
             std::string("Momentum factor masking: zero the momentum where the velocity was "
                         "sent (default: ") +
                 (opt.compressor.momentum.masking ? "on" : "off") +
                 (train::LmTrainDefaults::kMasking ? "" : "; lm: off") + ")");
  sub->add_option("--selection", cmd->selection,
                  "Threshold selection: sampled (the paper's) or exact (top-k)")
      ->check(CLI::IsMember({"sampled", "exact"}))
      ->capture_default_str();
  sub->add_option("--sample-ratio", opt.compressor.selection.sample_ratio,
                  "Fraction sampled to estimate the threshold")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  sub->add_option("--value-type", cmd->value_type, "Wire type of sent values: fp32, fp16, bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  sub->add_option("--exchange", cmd->exchange,
                  "Exchange algorithm: allgather, direct (one all-to-all round), sparse-allreduce "
                  "(Ok-Topk-style; what is not applied stays in the residual) or auto")
      ->check(CLI::IsMember({"allgather", "direct", "sparse-allreduce", "auto"}))
      ->capture_default_str();
  sub->add_option("--dense-path", cmd->dense_path,
                  "How the tensors left dense (1-D, below --min-compress-numel) travel: grouped "
                  "(one more DGC tensor at --dense-path-density, its own momentum and velocity), "
                  "fp16 or bf16 (16-bit average with error feedback), or exact (fp32 average)")
      ->check(CLI::IsMember({"exact", "grouped", "fp16", "bf16"}))
      ->capture_default_str();
  sub->add_option("--selection-scope", cmd->selection_scope,
                  std::string("Over what DGC takes its top d: tensor (each tensor its own "
                              "threshold, the paper's) or global (one threshold over every "
                              "tensor of the model at once; no dense path) (default: ") +
                      cmd->selection_scope +
                      "; lm: " + train::to_string(train::LmTrainDefaults::kSelectionScope) + ")")
      ->check(CLI::IsMember({"tensor", "global"}));
  sub->add_option("--dense-path-density", opt.dense_path_density,
                  "Density of the dense-path group after warm-up (--dense-path grouped)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  sub->add_option("--on-nonfinite", cmd->on_nonfinite,
                  "When any worker's gradient holds NaN or Inf: stop (every worker stops with an "
                  "error, nothing applied) or skip (every worker skips the step: nothing applied, "
                  "the iteration moves on, the step is counted in skipped_steps)")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  sub->add_option("--max-consecutive-skips", opt.max_consecutive_skips,
                  "With --on-nonfinite skip: the most steps skipped in a row; one more bad step "
                  "stops the run")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  sub->add_option("--min-compress-numel", opt.policy.min_numel,
                  "Tensors with fewer elements go dense")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_flag("--compress-1d", opt.policy.compress_1d,
                "Compress 1-D tensors (biases) too; by default they go dense");
  sub->add_option("--weight-decay", opt.weight_decay,
                  "L2 weight decay, applied locally after the exchange (lm and speech default: 0)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option(
         "--clip-norm", opt.clip_norm,
         "Clip gradients at this L2 norm (dense: the averaged gradient, at clip-norm; DGC: each "
         "worker's gradient before accumulation, see --clip-scaling); 0 = off. lm default: 0.25, "
         "speech default: 1")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--clip-scaling", cmd->clip_scaling,
                  "DGC's local clipping threshold: paper = clip-norm / sqrt(workers) on each "
                  "worker's share (gradient / workers) of the summed gradient, as in the paper's "
                  "Algorithm 1 (clip-norm * sqrt(workers) on its mean gradient); mean = "
                  "clip-norm / sqrt(workers) on its mean gradient, sqrt(workers) to workers times "
                  "tighter than dense clipping")
      ->check(CLI::IsMember({"paper", "mean"}))
      ->capture_default_str();
  sub->add_option("--lr", opt.lr.base, "Base learning rate (lm default: 5, speech default: 0.25)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--lr-warmup-epochs", opt.lr.warmup_epochs,
                  "Linear learning-rate warm-up (Goyal et al.), epochs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_flag("--lr-in-velocity", opt.lr_in_velocity,
                "DGC: put the learning-rate schedule inside the accumulation (each gradient enters "
                "the momentum and velocity scaled by lr_t / lr; every update is applied at --lr), "
                "so an element sent late moves at the rates of the steps it came from "
                "(default: off)");
  sub->add_option("--lr-decay", cmd->lr_decay,
                  "After warm-up: cosine (to 0 at the last epoch) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}))
      ->capture_default_str();
  sub->add_option("--epochs", o.epochs, "Epochs (speech default: 10)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub->add_option(
         "--batch-size", o.batch_size,
         "Examples per worker per iteration (lm: sequences of --bptt tokens, default 10; speech: "
         "utterances, default 4)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "Seed of initialisation, data order and sampling")
      ->capture_default_str();
  sub->add_option("--checkpoint", o.checkpoint,
                  "Checkpoint path prefix: each rank r writes PATH.step<S>.rank<r> after step S "
                  "at every epoch's end (and every --checkpoint-every steps), atomically, with a "
                  "checksum");
  sub->add_option("--checkpoint-every", o.checkpoint_every,
                  "Also checkpoint inside epochs, after every S-th step of the run (0: at epoch "
                  "ends only); a resume continues from that step, bit for bit")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--checkpoint-keep", o.checkpoint_keep,
                  "Checkpoints kept per rank: the newest K steps' files (0: all); older ones are "
                  "deleted once every rank has written a newer one")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--resume", cmd->resume,
                  "Continue from the newest checkpoint every rank has at --checkpoint (refused, "
                  "naming the previous good step, when it cannot be read). --resume auto: start "
                  "fresh when no rank has a checkpoint, else continue from the newest complete "
                  "set, at another number of workers too (the same command for the first "
                  "attempt and every restart)")
      ->expected(0, 1);
  sub->add_option("--resume-step", o.resume_step,
                  "Continue from the checkpoint of step S (implies --resume), e.g. the previous "
                  "good one when the newest is damaged")
      ->check(CLI::NonNegativeNumber);
  sub->add_option(
      "--metrics", cmd->metrics,
      "Write one JSON object per epoch to this file (JSON lines; appended on --resume)");
  sub->add_option("--train-examples", o.train_examples,
                  "Use only the first N training examples (0 = all 60000; lm: the first N "
                  "training verses; speech: the first N training utterances)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--test-examples", o.test_examples,
                  "Use only the first N test examples (0 = all 10000; lm: the first N "
                  "validation and N test verses; speech: the first N test utterances, clean "
                  "and noisy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--progress", cmd->progress,
                  "Progress display: bar (redrawn in place), lines (one every 10 s), or auto (bar "
                  "on a terminal with local workers, lines otherwise)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  sub->add_option("--threads", o.threads,
                  "libtorch threads per worker (0: OMP_NUM_THREADS if set, else cores / workers on "
                  "this host, from LOCAL_WORLD_SIZE under torchrun)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  sub->callback([cmd, sub] { run(*cmd, *sub); });
}

}  // namespace dgc::cli
