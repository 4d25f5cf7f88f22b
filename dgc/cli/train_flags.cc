// dgc train's flags (train_command.h): each one onto TrainCommand or the options structs it
// holds. Where a default is the task's, the help shows each task's from the same table that
// applies it (train_tasks.cc); enum flags take the names of the enum's table.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "dgc/cli/train_command.h"
#include "dgc/train/models.h"

namespace dgc::cli {
namespace {

// An on/off setting as two flags, --NAME and --no-NAME; the last one given wins. (CLI11's
// "--NAME,!--no-NAME" prints "{false}" beside the pair, which reads as the default; the help
// says the default instead.)
void add_switch(CLI::App& sub, const std::string& name, bool& target, const std::string& help) {
  sub.add_flag_callback(
      "--" + name, [&target] { target = true; }, help);
  sub.add_flag_callback(
      "--no-" + name, [&target] { target = false; }, "Turn --" + name + " off");
}

std::string defaults(const std::string& flag) { return task_defaults_help(flag); }

// "{a,b}": the names of the table but the values left out (which a flag still takes but does not
// list: the experiments behind --set).
template <typename E, size_t N>
std::string listed(const EnumNames<E, N>& names, std::initializer_list<E> left_out) {
  std::string text;
  for (const auto& entry : names) {
    if (std::find(left_out.begin(), left_out.end(), entry.value) != left_out.end()) continue;
    text += (text.empty() ? "{" : ",") + std::string(entry.name);
  }
  return text + "}";
}

}  // namespace

void add_train_flags(CLI::App& sub, TrainCommand& cmd) {
  auto& o = cmd.options;
  auto& opt = o.optimizer;
  sub.add_option("--task", cmd.task,
                 "image (Fashion-MNIST classification), lm (KJV language model) or speech "
                 "(spoken letters and digits, CTC); flags marked [image], [lm] or [speech] "
                 "belong to those tasks only")
      ->check(CLI::IsMember(task_names()))
      ->capture_default_str();
  sub.add_option("--cache-dir", cmd.lm.cache_dir,
                 "[lm, speech] Directory for the prepared corpora (default $XDG_CACHE_HOME/dgc or "
                 "~/.cache/dgc): the KJV, prepared from the `bible` program (bible-kjv) on first "
                 "use; the speech corpus, synthesised with espeak-ng on first use");
  sub.add_option("--corpus-seed", cmd.speech.corpus.seed,
                 "[speech] Seed of the speech corpus (words, voices; not the training seed)")
      ->capture_default_str();
  sub.add_option("--corpus-train", cmd.speech.corpus.train_utterances,
                 "[speech] Training utterances in the corpus (voices of the training variants)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub.add_option("--corpus-test", cmd.speech.corpus.test_utterances,
                 "[speech] Test utterances in the corpus (held-out variants; also a noisy copy)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub.add_option("--gru-hidden", cmd.speech.hidden, "[speech] GRU units per direction")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub.add_option("--gru-layers", cmd.speech.layers, "[speech] Bidirectional GRU layers")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  sub.add_option("--frame-stack", cmd.speech.stack,
                 "[speech] 10 ms feature frames stacked into one GRU step (and the stride)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  sub.add_option("--vocabulary", cmd.lm.vocabulary,
                 "[lm] Vocabulary size V: the most frequent training words, <unk> and <eos>")
      ->check(CLI::Range(int64_t{3}, int64_t{1} << 20))
      ->capture_default_str();
  sub.add_option("--embedding", cmd.lm.embedding, "[lm] Word embedding size E")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub.add_option("--hidden", cmd.lm.hidden, "[lm] LSTM hidden size H (2 layers)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub.add_option("--bptt", cmd.lm.bptt,
                 "[lm] Tokens per sequence (truncated back-propagation through time)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  sub.add_option("--dropout", cmd.lm.dropout, "[lm] Dropout probability")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();

  sub.add_option("--model", o.model,
                 "[image] Model: cnn, mlp or resnet20 (" + defaults("--model") + ")")
      ->check(CLI::IsMember(train::model_names()));
  sub.add_option("--data", cmd.data,
                 "[image] Directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "
                 "(Debian package dataset-fashion-mnist)")
      ->capture_default_str();
  sub.add_option("--workers", cmd.workers,
                 "Local worker threads (under mpirun/torchrun each process is one worker; if "
                 "given there, it must equal the world size)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub.add_option("--backend", cmd.backend, "auto (mpi under mpirun, gloo otherwise), gloo or mpi")
      ->check(CLI::IsMember({"auto", "gloo", "mpi"}))
      ->capture_default_str();
  sub.add_option("--rendezvous", cmd.rendezvous,
                 "Shared directory where Gloo ranks meet (one process per rank: under mpirun with "
                 "--backend gloo, or under torchrun instead of the TCP store)");
  sub.add_option("--timeout", cmd.timeout_seconds, "Timeout of every collective, seconds")
      ->capture_default_str();
  sub.add_option("--job-secret-file", cmd.job_secret_file,
                 "File (mode 600, the same on every rank) holding the job secret; or set "
                 "DGC_JOB_SECRET. With a secret, exchange messages and rendezvous values carry "
                 "HMAC-SHA256 tags and a rank with another secret is refused (docs/"
                 "reliability.md). Never give the secret itself on the command line");
  sub.add_option("--compression", cmd.compression, "dgc, or none for the dense baseline")
      ->check(CLI::IsMember(names_of(train::kCompressionNames)))
      ->capture_default_str();
  sub.add_option("--density", opt.density.after_warmup,
                 "Fraction of each compressed tensor sent after warm-up (d)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  sub.add_option("--warmup-epochs", opt.density.warmup_epochs,
                 "Density warm-up: density max(d, 0.25^(s+1)) in warm-up stage s")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--warmup-stages", o.warmup_stages,
                 "The density warm-up's stages, spread evenly over --warmup-epochs (0: one stage "
                 "per epoch)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--momentum", opt.compressor.momentum.factor, "Momentum m")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  add_switch(sub, "nesterov", opt.compressor.momentum.nesterov,
             std::string("Nesterov momentum (default: ") +
                 (opt.compressor.momentum.nesterov ? "on)" : "off)"));
  add_switch(sub, "masking", opt.compressor.momentum.masking,
             std::string("Momentum factor masking: zero the momentum where the velocity was "
                         "sent (") +
                 defaults("--masking") + ")");
  sub.add_option("--selection", cmd.selection,
                 "Threshold selection: sampled (the paper's) or exact (top-k)")
      ->check(CLI::IsMember(names_of(kSelectionMethodNames)))
      ->capture_default_str();
  sub.add_option("--sample-ratio", opt.compressor.selection.sample_ratio,
                 "Fraction sampled to estimate the threshold")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  sub.add_option("--value-type", cmd.value_type, "Wire type of sent values: fp32, fp16, bf16")
      ->check(CLI::IsMember(names_of(kValueTypeNames)))
      ->capture_default_str();
  sub.add_option("--exchange", cmd.exchange,
                 "Exchange algorithm: allgather, direct (one all-to-all round), sparse-allreduce "
                 "(Ok-Topk-style; what is not applied stays in the residual) or auto (with "
                 "--link: the one dgc plan's cost model predicts fastest; without: by the "
                 "number of workers and the message size)")
      ->check(CLI::IsMember(names_of(kExchangeAlgorithmNames)))
      ->capture_default_str();
  sub.add_option("--link", cmd.options.exchange_link,
                 "For --exchange auto: the link between the workers, a platform of "
                 "bench/platforms (ethernet-1g, ethernet-10g, ethernet-100m, mobile, ...) or "
                 "RATE_MBIT[:LATENCY_MS] (one way, host to host; default 0.05 ms); at 5 ms or "
                 "more, --pipeline defaults to 1");
  opt.bucket_cap_mb = 25.0;  // dgc train's default, as DDP's (the library's is 0: one message)
  sub.add_option("--bucket-cap-mb", opt.bucket_cap_mb,
                 "Gradient buckets of about this many MB (fp32), in the reverse of the "
                 "parameters' order, as PyTorch DDP's bucket_cap_mb: each bucket's compression and "
                 "exchange (with --compression none its allreduce) start during the backward pass "
                 "once its gradients are ready; 0: one message after the backward pass. Global "
                 "selection, clipping and --on-nonfinite skip always send one message")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--pipeline", opt.pipeline,
                 "1: the pipelined step, for high-latency links: each step's exchange runs while "
                 "the next step computes, which takes its gradient at the weights with this "
                 "rank's own selection applied (a lookahead for the update in flight) and "
                 "applies the update when it lands; one message per step, Nesterov momentum "
                 "unless --no-nesterov (docs/training.md). 0: synchronous. Default 1 with a "
                 "--link of 5 ms or more one way (mobile), 0 otherwise")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  opt.last_bucket_cap_mb = 1.0;  // dgc train's default (the library's is 0)
  sub.add_option("--last-bucket-cap-mb", opt.last_bucket_cap_mb,
                 "With buckets: the last bucket of tensors (the first layers, whose gradients come "
                 "last, so none of its work overlaps the backward pass) cut to about this many MB, "
                 "the rest of the bucket the cap gives going before it; 0: as the cap gives it")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  // fp16 and bf16 are experiments (--set dense_path=fp16|bf16); the flag still takes them, as a
  // deprecated spelling, and lists the others.
  sub.add_option("--dense-path", cmd.dense_path,
                 "How the tensors left dense (1-D, below --min-compress-numel) travel: grouped "
                 "(one more DGC tensor at --dense-path-density, its own momentum and velocity) "
                 "or exact (fp32 average); the 16-bit averages are experiments (--set "
                 "dense_path=fp16|bf16)")
      ->check(CLI::IsMember(names_of(train::kDensePathNames))
                  .description(listed(train::kDensePathNames,
                                      {train::DensePath::kFloat16, train::DensePath::kBFloat16})))
      ->capture_default_str();
  sub.add_option("--selection-scope", cmd.selection_scope,
                 std::string("Over what DGC takes its top d: tensor (each tensor its own "
                             "threshold, the paper's) or global (one threshold over every "
                             "tensor of the model at once; no dense path) (") +
                     defaults("--selection-scope") + ")")
      ->check(CLI::IsMember(names_of(train::kSelectionScopeNames)));
  sub.add_option("--dense-path-density", opt.dense_path_density,
                 "Density of the dense-path group after warm-up (--dense-path grouped)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  sub.add_option("--on-nonfinite", cmd.on_nonfinite,
                 "When any worker's gradient holds NaN or Inf: stop (every worker stops with an "
                 "error, nothing applied) or skip (every worker skips the step: nothing applied, "
                 "the iteration moves on, the step is counted in skipped_steps)")
      ->check(CLI::IsMember(names_of(train::kNonFinitePolicyNames)))
      ->capture_default_str();
  sub.add_option("--max-consecutive-skips", opt.max_consecutive_skips,
                 "With --on-nonfinite skip: the most steps skipped in a row; one more bad step "
                 "stops the run")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  sub.add_option("--min-compress-numel", opt.policy.min_numel,
                 "Tensors with fewer elements go dense")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_flag("--compress-1d", opt.policy.compress_1d,
               "Compress 1-D tensors (biases) too; by default they go dense");
  sub.add_option(
         "--weight-decay", opt.weight_decay,
         "L2 weight decay, applied locally after the exchange (" + defaults("--weight-decay") + ")")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--clip-norm", opt.clip_norm,
                 "Clip gradients at this L2 norm (dense: the averaged gradient, at clip-norm; DGC: "
                 "each worker's gradient before accumulation, the paper's threshold clip-norm / "
                 "sqrt(workers) on its share of the summed gradient); 0 = off (" +
                     defaults("--clip-norm") + ")")
      ->check(CLI::NonNegativeNumber);
  // Deprecated spellings of --set clip_scaling=... and --set lr_in_velocity=1 (hidden).
  sub.add_option("--clip-scaling", cmd.clip_scaling, "Deprecated: --set clip_scaling=paper|mean")
      ->check(CLI::IsMember(names_of(kClipScalingNames)))
      ->group("");
  sub.add_option("--lr", opt.lr.base, "Base learning rate (" + defaults("--lr") + ")")
      ->check(CLI::PositiveNumber);
  sub.add_option("--lr-warmup-epochs", opt.lr.warmup_epochs,
                 "Linear learning-rate warm-up (Goyal et al.), epochs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_flag("--lr-in-velocity", opt.lr_in_velocity, "Deprecated: --set lr_in_velocity=1")
      ->group("");
  sub.add_option("--lr-scaling", cmd.lr_scaling,
                 "How --lr follows the global batch (workers x --batch-size) when workers are "
                 "added: sqrt (lr x sqrt(global / --lr-batch)), linear (lr x global / --lr-batch) "
                 "or none; the same rule for dense and DGC (" +
                     defaults("--lr-scaling") + ")")
      ->check(CLI::IsMember(names_of(train::kLrScalingNames)));
  sub.add_option("--lr-batch", cmd.options.lr_reference_batch,
                 "The global batch --lr is meant for, under --lr-scaling (" +
                     defaults("--lr-batch") + "; image: the 4 workers x 32 its lr was tuned at)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--lr-batch-limit", cmd.options.lr_batch_limit,
                 "Under --lr-scaling, the global batch where the rule stops: larger global "
                 "batches get its rate (0: no limit; " +
                     defaults("--lr-batch-limit") +
                     "; image: 32 workers x 32, rate 0.283, the largest global batch the rule was "
                     "seen to hold at)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--residual-stats", cmd.options.residual_stats,
               "DGC: measure rank 0's residual every epoch and add it to --metrics (residual_*: "
               "mean and 90th-percentile age in steps of the elements sent, the fraction never "
               "sent, the residual's mass against the epoch's sent mass; with allgather or "
               "direct, the fraction of its selected indices other workers also selected; "
               "default: off)");
  sub.add_option("--lr-decay", cmd.lr_decay,
                 "After warm-up: cosine (to 0 at the last epoch) or constant; step decay is an "
                 "experiment (--set lr_decay=step)")
      ->check(CLI::IsMember(names_of(kLrDecayNames))
                  .description(listed(kLrDecayNames, {LearningRateSchedule::Decay::kStep})))
      ->capture_default_str();
  sub.add_option("--epochs", o.epochs, "Epochs (" + defaults("--epochs") + ")")
      ->check(CLI::Range(1, 100000));
  sub.add_option(
         "--batch-size", o.batch_size,
         "Examples per worker per iteration (lm: sequences of --bptt tokens; speech: utterances; " +
             defaults("--batch-size") + ")")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub.add_option("--seed", o.seed, "Seed of initialisation, data order and sampling")
      ->capture_default_str();
  sub.add_option("--checkpoint", o.checkpoint,
                 "Checkpoint path prefix: each rank r writes PATH.step<S>.rank<r> after step S "
                 "at every epoch's end (and every --checkpoint-every steps), atomically, with a "
                 "checksum");
  sub.add_option("--checkpoint-every", o.checkpoint_every,
                 "Also checkpoint inside epochs, after every S-th step of the run (0: at epoch "
                 "ends only); a resume continues from that step, bit for bit")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--checkpoint-keep", o.checkpoint_keep,
                 "Checkpoints kept per rank: the newest K steps' files (0: all); older ones are "
                 "deleted once every rank has written a newer one")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--resume", cmd.resume,
                 "Continue from the newest checkpoint every rank has at --checkpoint (refused, "
                 "naming the previous good step, when it cannot be read). --resume auto: start "
                 "fresh when no rank has a checkpoint, else continue from the newest complete "
                 "set, at another number of workers too (the same command for the first "
                 "attempt and every restart)")
      ->expected(0, 1);
  sub.add_option("--resume-step", o.resume_step,
                 "Continue from the checkpoint of step S (implies --resume), e.g. the previous "
                 "good one when the newest is damaged")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--metrics", cmd.metrics,
                 "Write one JSON object per epoch to this file (JSON lines; appended on --resume)");
  sub.add_option("--train-examples", o.train_examples,
                 "Use only the first N training examples (0 = all 60000; lm: the first N "
                 "training verses; speech: the first N training utterances)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--test-examples", o.test_examples,
                 "Use only the first N test examples (0 = all 10000; lm: the first N "
                 "validation and N test verses; speech: the first N test utterances, clean "
                 "and noisy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--progress", cmd.progress,
                 "Progress display: bar (redrawn in place), lines (one every 10 s), or auto (bar "
                 "on a terminal with local workers, lines otherwise)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  sub.add_option("--threads", o.threads,
                 "libtorch threads per worker (0: OMP_NUM_THREADS if set, else cores / workers on "
                 "this host, from LOCAL_WORLD_SIZE under torchrun)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--set", cmd.settings,
                 "Experiment settings, KEY=VALUE, repeatable (docs/training.md, \"Experiment "
                 "settings\"): " +
                     settings_help())
      ->allow_extra_args(false);
}

}  // namespace dgc::cli
