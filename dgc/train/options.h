// Options of the distributed optimizer (docs/algorithm.md), without libtorch, so the command line
// can fill them without including torch. Every field has a documented default; `dgc train` maps
// its flags onto these one to one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dgc/comm/communicator.h"
#include "dgc/core/auth.h"
#include "dgc/core/clip.h"
#include "dgc/core/names.h"
#include "dgc/core/options.h"
#include "dgc/core/policy.h"
#include "dgc/core/schedule.h"
#include "dgc/exchange/algorithm.h"

namespace dgc::train {

// What travels: `kNone` is the dense baseline (every tensor allreduce-averaged, momentum SGD);
// `kDgc` compresses the tensors the policy picks.
enum class Compression : uint8_t { kNone, kDgc };
inline constexpr EnumNames<Compression, 2> kCompressionNames = {
    {{Compression::kDgc, "dgc"}, {Compression::kNone, "none"}}};
Compression parse_compression(const std::string& name);  // "none" | "dgc"; dgc::InvalidArgument
std::string to_string(Compression compression);

// How the dense-path tensors (those the policy does not compress: 1-D tensors such as biases and
// normalisation parameters, and tensors below the size cut-off) travel with DGC.
//   kExact:    an exact fp32 average (one allreduce), ordinary momentum SGD per tensor.
//   kGrouped:  all of them, concatenated in layout order, form one more compressed tensor (the
//              "dense-path group") with its own momentum u and velocity v, compressed by DGC at
//              its own density (`dense_path_density`, with the same warm-up), momentum
//              correction and masking as docs/algorithm.md; weight decay stays local per tensor
//              as for every compressed tensor. Its entry travels in the fused message.
//   kFloat16,
//   kBFloat16: the average of 16-bit values: each rank rounds its gradient plus its residual to
//              fp16 / bf16 and keeps what rounding dropped as the residual (error feedback,
//              round_with_residual); ordinary momentum SGD on the average, as with kExact.
enum class DensePath : uint8_t { kExact, kGrouped, kFloat16, kBFloat16 };
inline constexpr EnumNames<DensePath, 4> kDensePathNames = {{{DensePath::kExact, "exact"},
                                                             {DensePath::kGrouped, "grouped"},
                                                             {DensePath::kFloat16, "fp16"},
                                                             {DensePath::kBFloat16, "bf16"}}};
// "exact" | "grouped" | "fp16" | "bf16"; anything else throws dgc::InvalidArgument.
DensePath parse_dense_path(const std::string& name);
std::string to_string(DensePath dense_path);

// Over what DGC selects its top d (docs/algorithm.md step 3).
//   kTensor: each compressed tensor its own threshold, about d of its elements (the paper's
//            Algorithm 1, layer by layer); the dense path travels as `dense_path` says.
//   kGlobal: one threshold over the whole model: every tensor, the policy's dense-path ones
//            included, concatenated in layout order, is one compressed tensor stepped at
//            `density` (momentum correction, sampled selection, masking, warm-up as
//            docs/algorithm.md), so that the top d of all |v| travels, wherever it is. It is the
//            grouped dense path holding every tensor: it needs `dense_path` kGrouped,
//            `dense_path_density` and the policy are not used, and its bytes count as
//            message_bytes_dense_path.
enum class SelectionScope : uint8_t { kTensor, kGlobal };
inline constexpr EnumNames<SelectionScope, 2> kSelectionScopeNames = {
    {{SelectionScope::kTensor, "tensor"}, {SelectionScope::kGlobal, "global"}}};
// "tensor" | "global"; anything else throws dgc::InvalidArgument.
SelectionScope parse_selection_scope(const std::string& name);
std::string to_string(SelectionScope scope);

// What every rank does when any rank's gradient is not finite (NaN or infinity) at a step; the
// decision is collective (each rank's flag travels in its exchange message), and either way
// nothing of the step is applied: weights, momenta, velocities, the rounding residual and the
// compressor's RNG stay as before the step.
//   kStop: every rank throws dgc::NumericError (the run stops; resume from a checkpoint).
//   kSkip: every rank skips the step: run() returns false with zero directions, the step is
//          counted (skipped_steps) and the iteration counter advances, as it does for the data
//          (the bad batch is consumed) and the schedules. More than max_consecutive_skips skips
//          in a row stop the run as kStop does, so that a diverging run does not skip forever.
enum class NonFinitePolicy : uint8_t { kStop, kSkip };
inline constexpr EnumNames<NonFinitePolicy, 2> kNonFinitePolicyNames = {
    {{NonFinitePolicy::kStop, "stop"}, {NonFinitePolicy::kSkip, "skip"}}};
// "stop" | "skip"; anything else throws dgc::InvalidArgument.
NonFinitePolicy parse_nonfinite_policy(const std::string& name);
std::string to_string(NonFinitePolicy policy);

struct OptimizerOptions {
  Compression compression = Compression::kDgc;

  // Momentum (m, Nesterov, masking), selection, wire value type, threads and sampling seed of the
  // compressor. momentum.factor and momentum.nesterov also drive the dense path (and the dense
  // baseline). The density of each step comes from `density` below.
  CompressionOptions compressor;

  // The collective of the compressed tensors' exchange (dgc/exchange/algorithm.h; kAuto picks by
  // world size, density and model size). With sparse-allreduce what a rank selected but the
  // exchange did not apply goes back into its velocity. Ignored with kNone.
  ExchangeAlgorithm exchange = ExchangeAlgorithm::kAllgather;

  // Which tensors are compressed (ignored with kNone: everything is dense).
  PolicyOptions policy;

  // How the tensors the policy leaves dense travel (ignored with kNone). kGrouped by default:
  // on ResNet-20 it lifts the compression ratio after warm-up from about 100x to several hundred
  // (docs/training.md, "Dense-path strategies").
  DensePath dense_path = DensePath::kGrouped;
  // Density of the dense-path group after warm-up (kGrouped only); the warm-up raises it as
  // max(dense_path_density, 0.25^(stage+1)) on the schedule of `density`.
  double dense_path_density = 0.1;

  // Per tensor (the paper's) or over the whole model at once (see SelectionScope).
  SelectionScope selection_scope = SelectionScope::kTensor;

  // Density d after warm-up and the exponential warm-up (density_at). Paper: d = 0.001.
  DensitySchedule density{.after_warmup = 0.001, .warmup_epochs = 1.0, .iterations_per_stage = 0};

  // Base learning rate, linear warm-up alongside the density warm-up, cosine decay to 0 at
  // total_epochs (lr_at). total_epochs is set by the trainer.
  LearningRateSchedule lr{.base = 0.1, .warmup_epochs = 1.0};
  // DGC only: the schedule's factor lr_t / lr goes inside the accumulation. Each step's gradient
  // (after local clipping; the weight-decay term too) enters the momentum and the velocity scaled
  // by lr_t / lr, and the caller applies every direction at the base lr: an element sent k steps
  // after it was accumulated moves by the learning rates of the steps it came from, not by the
  // (lower, or during warm-up higher) rate of the step that sends it. With a constant rate it
  // changes nothing. The libtorch optimizer applies it; the DDP hook (python/) does not offer it
  // (there the user's torch optimizer applies the rate).
  bool lr_in_velocity = false;

  // L2 weight decay wd. Applied locally after the exchange (it need not travel): for compressed
  // tensors through its own momentum buffer, for dense tensors added to the averaged gradient
  // before the ordinary momentum (the same thing, by linearity). 0 disables.
  double weight_decay = 1e-4;

  // Gradient clipping by L2 norm, 0 = off. With DGC: local clipping of this worker's gradient
  // before accumulation (docs/algorithm.md step 1), at local_clip_limit(clip_norm, N,
  // clip_scaling): the paper's threshold clip_norm / sqrt(N) on the worker's share g / N of the
  // summed gradient by default (clip_norm * sqrt(N) on its mean gradient g), or clip_norm /
  // sqrt(N) on g itself.
  // Dense baseline: the averaged gradient is clipped at clip_norm (what dense training does).
  double clip_norm = 0.0;
  ClipScaling clip_scaling = ClipScaling::kPaper;

  // A non-finite gradient on any rank: stop the run, or skip the step on every rank (see
  // NonFinitePolicy). With kSkip, the most steps skipped in a row before the run stops (>= 1).
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kStop;
  int64_t max_consecutive_skips = 10;

  // Gradient buckets (buckets.h): the cap of one bucket in MB (2^20 bytes of fp32 gradients), as
  // PyTorch DDP's bucket_cap_mb; each bucket's compression and exchange start during the backward
  // pass once its gradients are ready. 0: one message after the backward pass (the default of the
  // library; `dgc train` defaults to 25, as DDP). Not in describe(): the weights do not depend on
  // it; the buckets' own handshakes check that every rank has the same.
  double bucket_cap_mb = 0.0;
  // With buckets: the last bucket of tensors (the first layers', whose gradients are ready only
  // when the backward pass ends, so that none of its work overlaps it) is cut to about this many
  // MB: of the bucket the cap makes last, the first layers up to this size (at least one tensor)
  // form the last bucket and the rest the bucket before it. 0: as the cap makes it. Not in
  // describe(), as bucket_cap_mb.
  double last_bucket_cap_mb = 0.0;
  // 1: the pipelined step (`dgc train --pipeline 1`, DistributedOptimizer): step t's exchange
  // runs while step t+1's forward and backward pass compute, which are taken at the weights with
  // this rank's own selection of step t applied (the lookahead); step t+1 applies step t's update
  // before it starts its own. One message per step. 0: synchronous.
  int pipeline = 0;

  // Iterations per epoch, for the epoch-based schedules. Must be >= 1.
  int64_t iterations_per_epoch = 1;

  // Timeout of every collective the optimizer runs (kUnsetTimeout: the communicator's default).
  comm::Timeout timeout = comm::kUnsetTimeout;

  // The job's exchange key (JobKeys::exchange, dgc/core/auth.h) when the job has a secret: the
  // exchange tags and verifies every message (exchange.h). Not part of describe(): it never
  // travels in the handshake's settings nor lands in a checkpoint.
  std::optional<MacKey> message_key;
};

// The "key=value" lines of every setting all ranks must agree on (sent through the handshake and
// stored in checkpoints).
std::string describe(const OptimizerOptions& options);

// Throws dgc::InvalidArgument, saying what to change, when options.pipeline is neither 0 nor 1 or
// is 1 with NonFinitePolicy::kSkip (a non-finite gradient is known only a step later). The
// optimizer checks it; dgc train checks it before any worker starts.
void check_pipeline(const OptimizerOptions& options);

// How the learning rate follows the global batch (workers x batch per worker) when users add
// workers and keep their batch per worker: --lr is the rate for a reference global batch B0, and
// the run uses lr * sqrt(B / B0) (kSqrt), lr * B / B0 (kLinear, Goyal et al.) or lr (kNone).
// The same rule for dense and DGC (docs/results.md, "Accuracy as workers are added").
enum class LrScaling : uint8_t { kNone, kSqrt, kLinear };
inline constexpr EnumNames<LrScaling, 3> kLrScalingNames = {
    {{LrScaling::kSqrt, "sqrt"}, {LrScaling::kLinear, "linear"}, {LrScaling::kNone, "none"}}};
LrScaling parse_lr_scaling(const std::string& name);  // "none" | "sqrt" | "linear"
std::string to_string(LrScaling scaling);
// lr for a global batch of `global_batch` under `scaling` from `lr` at `reference_batch`
// (dgc::InvalidArgument unless both batches are positive; kNone returns lr unchanged). With
// batch_limit > 0 the rule stops at that global batch: larger batches get its rate.
double scaled_learning_rate(double lr, LrScaling scaling, int64_t global_batch,
                            int64_t reference_batch, int64_t batch_limit = 0);

}  // namespace dgc::train
