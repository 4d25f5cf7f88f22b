// dgc train: data-parallel training of a task -- image classification on Fashion-MNIST (--task
// image, the default), a word-level LSTM language model on the King James Bible (--task lm) or a
// GRU-CTC speech recogniser on letters and digits spoken by espeak-ng (--task speech) -- with DGC
// or dense.
//
// Launch: through comm::connect(), as every dgc command: N local worker threads (default),
// `mpirun -np N dgc train` (MPI, or Gloo with --rendezvous DIR), torchrun, or the four variables
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by any other launcher.
// Flags map one to one onto dgc::train::TrainOptions / OptimizerOptions and the task's options
// (train_flags.cc); defaults are theirs, except the few a task sets (train::TaskDefaults,
// train_tasks.cc) when the flag is absent. A flag of one task given with another task is an
// error. This file runs the command: connect, train, print.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dgc/cli/commands.h"
#include "dgc/cli/train_command.h"
#include "dgc/comm/launch.h"
#include "dgc/core/auth.h"
#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/progress.h"
#include "dgc/train/trainer.h"

namespace dgc::cli {
namespace {

using train::format_bytes;
using train::format_duration;

double ratio(uint64_t dense, uint64_t message) {
  return message > 0 ? static_cast<double>(dense) / static_cast<double>(message) : 0.0;
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
               {"exchange_seconds_max", m.exchange_seconds_max},
               {"compression", compression},
               {"workers", workers}});
  if (m.residual) {
    const auto& r = *m.residual;
    json.update({{"residual_sent_age_mean", r.sent_age_mean},
                 {"residual_sent_age_p90", r.sent_age_p90},
                 {"residual_never_sent_fraction", r.never_sent_fraction},
                 {"residual_l1", r.residual_l1},
                 {"residual_sent_l1", r.sent_l1},
                 {"residual_epochs", r.residual_epochs}});
    if (r.selection_overlap) {
      json.update({{"residual_selection_overlap", *r.selection_overlap},
                   {"residual_selection_shared_all", *r.selection_shared_all}});
    }
  }
  return json;
}

void run(TrainCommand& cmd, const CLI::App& sub) {
  const auto command_start = std::chrono::steady_clock::now();
  const bool workers_given = sub.count("--workers") > 0;
  const bool pipeline_given = sub.count("--pipeline") > 0;
  train::TrainOptions options = resolve_options(cmd, sub);
  auto& opt = options.optimizer;

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

  const std::unique_ptr<train::Task> task = task_entry(cmd.task).make(cmd);

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
            std::printf("  dense path %s", train::to_string(opt.dense_path).c_str());
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
        if (!info.exchange_choice.empty()) std::printf("  %s\n", info.exchange_choice.c_str());
        if (info.buckets > 1) {
          std::printf(
              "  %lld gradient buckets of about %g MB, each exchanged during the backward "
              "pass once its gradients are ready\n",
              static_cast<long long>(info.buckets), opt.bucket_cap_mb);
        } else if (!info.one_message_reason.empty()) {
          std::printf("  one message after the backward pass: %s\n",
                      info.one_message_reason.c_str());
        }
        std::string clip;
        if (opt.clip_norm > 0 && opt.compression == train::Compression::kDgc) {
          clip = detail::concat(", clip norm ", opt.clip_norm, " (", to_string(opt.clip_scaling),
                                " scaling: each worker's gradient at ",
                                local_clip_limit(opt.clip_norm, workers, opt.clip_scaling), ")");
        } else if (opt.clip_norm > 0) {
          clip = detail::concat(", clip norm ", opt.clip_norm, " (the averaged gradient)");
        }
        std::string scaling;
        if (options.lr_scaling != train::LrScaling::kNone) {
          const int64_t global = options.batch_size * info.world_size;
          scaling = detail::concat(" = ", opt.lr.base, " at a global batch of ",
                                   options.lr_reference_batch, ", ",
                                   train::to_string(options.lr_scaling), "-scaled to ", global);
          if (options.lr_batch_limit > 0 && global > options.lr_batch_limit) {
            scaling += detail::concat(" (held at the rate of ", options.lr_batch_limit,
                                      ", --lr-batch-limit)");
          }
        }
        std::printf(
            "  lr %g%s (%s, %g warm-up epochs%s), momentum %g%s, weight decay %g%s\n", info.lr,
            scaling.c_str(), name_of(kLrDecayNames, opt.lr.decay), opt.lr.warmup_epochs,
            opt.lr_in_velocity ? ", inside the velocity" : "", opt.compressor.momentum.factor,
            opt.compressor.momentum.nesterov ? " (Nesterov)" : "", opt.weight_decay, clip.c_str());
        if (opt.pipeline != 0) {
          std::printf(
              "  pipelined (--pipeline 1): each step's exchange runs while the next step "
              "computes, whose gradient is taken at the weights with this rank's own selection "
              "applied (a lookahead for the update in flight, taken back when it lands); "
              "%s momentum%s%s\n",
              opt.compressor.momentum.nesterov ? "Nesterov" : "heavy-ball",
              opt.compressor.momentum.nesterov ? " (--no-nesterov for heavy ball)" : "",
              pipeline_given ? ""
                             : "; the default for a --link of 5 ms or more one way "
                               "(--pipeline 0 turns it off)");
        }
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
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train a task with data-parallel SGD, compressed with DGC (--compression dgc) or dense "
      "(--compression none): an image classifier on Fashion-MNIST (--task image), a word-level "
      "LSTM language model on the King James Bible (--task lm) or a GRU-CTC recogniser of letters "
      "and digits spoken by espeak-ng (--task speech). Runs --workers local threads, or "
      "one worker per process under mpirun or with torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/"
      "MASTER_PORT.");

  add_train_flags(*sub, *cmd);
  sub->callback([cmd, sub] { run(*cmd, *sub); });
}

}  // namespace dgc::cli
