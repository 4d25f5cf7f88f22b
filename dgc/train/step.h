// The distributed step of momentum SGD with DGC on float buffers: from every rank's local
// gradients to the update direction each parameter must take (w -= lr * direction). No libtorch:
// the libtorch optimizer (optimizer.h) and the DDP communication hook of the Python package
// (python/) are two adapters over this one class, so both apply exactly the same policy.
//
// run(), on every rank:
//   1. checks that the local gradient is finite before any state is touched: by its sum of
//      squares where clipping or options.lr_in_velocity needs it before the compressor runs,
//      otherwise as it is read (dense-path tensors as they are copied into the flat buffer,
//      compressed tensors in the compressor's staged pass, which leaves the committed state as
//      it is);
//   2. DGC: clips locally (local_clip_limit, in place in `grads`), then with
//      options.lr_in_velocity scales them by lr_t / lr (lr_factor_at); dense-path tensors are
//      copied into one flat buffer; then the Compressor's step per compressed tensor (momentum
//      correction, selection at the scheduled density, masking), staged: written into the
//      compressor's second u and v buffers (Compressor::stage), the committed state untouched.
//      The dense path by options.dense_path: kGrouped steps the flat buffer as one more
//      compressed tensor at the dense-path density; kFloat16 / kBFloat16 round it with error
//      feedback (the new residual goes to a second buffer; the residual stays on this rank);
//      kExact leaves it;
//   3. the Exchange (options.exchange) of the compressed messages (sum / N) and one average of the
//      dense buffer (none with kGrouped; 16-bit values with kFloat16 / kBFloat16), this rank's
//      "gradient ok" flag in the message header, so every rank learns how many ranks were bad
//      without another round;
//   4. if any rank flagged a non-finite gradient: every rank discards the staged state (nothing of
//      the step was applied: u, v, the residual, the RNG are as before it) and, by
//      options.on_nonfinite, throws dgc::NumericError (kStop; momenta and iteration unchanged) or
//      skips the step (kSkip: zero directions, run() returns false, the iteration advances,
//      skipped_steps() counts it; more than max_consecutive_skips in a row throw as kStop).
//      Otherwise every rank commits the staged state (a swap of buffers, no copy), and what this
//      rank selected but the exchange did not apply (sparse-allreduce) goes back into its
//      velocity;
//   5. the direction (the momentum buffers advance here):
//        compressed tensor, and with kGrouped every dense-path tensor (its slice of the group):
//                           b = m*b + wd*w; direction = b + update  (Nesterov: wd*w + m*b + update;
//                           wd = 0: direction = update; the momentum is already inside update)
//        dense tensor:      g = avg + wd*w; u = m*u + g; direction = u  (Nesterov: g + m*u)
// With Compression::kNone every tensor takes the dense path (dense clipping: the averaged
// gradient at clip_norm).
//
// Collective: the constructor and run() must be called by every rank in the same order.
// Thread-safety: one DistributedStep per worker thread. The communicator must outlive it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dgc/core/compressor.h"
#include "dgc/exchange/exchange.h"
#include "dgc/train/options.h"
#include "dgc/train/step_kernels.h"

namespace dgc::train {

// Wall time of the parts of one step on this rank, seconds (for benchmarks).
struct StepTimings {
  double compress = 0.0;  // gradients read and checked, clipping, the compressor, the dense buffer
  double exchange = 0.0;  // Exchange::run: encode, collectives, decode
  double update = 0.0;    // the directions (and, in DistributedOptimizer, the weight update)
};

// One named float buffer of the step's state (for checkpoints and state dicts).
template <typename T>
struct NamedBuffer {
  std::string name;  // "optimizer/momentum/<tensor>", "dgc/velocity/<tensor>", ...
  std::span<T> values;
};

// After an exchange that some rank flagged a non-finite gradient in (OptimizerOptions::
// on_nonfinite): throws dgc::NumericError under kStop, or under kSkip once `consecutive_skips`
// has reached max_consecutive_skips, naming the ranks, the iteration and `remedy`; returns when
// the step is to be skipped. `limit_name` is how the caller's interface spells
// max_consecutive_skips ("--max-consecutive-skips" on the command line). The one policy of
// DistributedStep and the Python package's device step.
void check_nonfinite_step(const OptimizerOptions& options, int bad_ranks, int world,
                          int64_t iteration, bool local_ok, int64_t consecutive_skips,
                          const char* limit_name, const char* remedy);

// The settings text every rank's handshake compares: describe(options), then `run_settings`,
// ending in a newline.
std::string step_settings(const OptimizerOptions& options, const std::string& run_settings);
// The Exchange's options for a step with `options` and that settings text (the layout is the
// caller's). The one construction of DistributedStep and the Python package's device step.
ExchangeOptions exchange_options_of(const OptimizerOptions& options, const std::string& settings);

class DistributedStep {
 public:
  // Builds the layout (make_layout with options.policy; all dense with kNone) and runs the
  // Exchange's handshake over describe(options) plus `run_settings` (further "key=value" lines all
  // ranks must share). Does not touch any weights (the caller makes them equal on every rank).
  DistributedStep(comm::Communicator& comm,
                  const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
                  OptimizerOptions options, const std::string& run_settings = "");

  // One step (see the file comment). grads[i], weights[i] and directions[i] are tensor i of the
  // layout, each of its numel() elements. grads may be clipped in place; directions may alias
  // grads (the gradients are consumed before any direction is written). Throws
  // dgc::InvalidArgument on a size mismatch, dgc::NumericError when any rank's gradient is not
  // finite and options.on_nonfinite is kStop (or the skips in a row exceed
  // max_consecutive_skips), dgc::CommError / dgc::DecodeError from the exchange. Returns true when
  // the step was taken, false when every rank skipped it (kSkip): the directions are then zero
  // (w -= lr * 0 leaves w as it was) and the state is as before the step.
  bool run(std::span<const std::span<float>> grads, std::span<const std::span<const float>> weights,
           std::span<const std::span<float>> directions);
  // The same step, with the directions applied to the weights in place at the step's learning
  // rate, w -= update_lr_at(iteration()) * direction, and never stored: the weights end bit for
  // bit as after run() and `w[e] -= lr * direction[e]`, in one pass over each weight and its
  // momentum, and the update of a compressed tensor read only where the exchange wrote it.
  // Returns false, the weights untouched, when the step was skipped (kSkip).
  bool run_and_apply(std::span<const std::span<float>> grads,
                     std::span<const std::span<float>> weights);

  // kSkip: the steps skipped so far (restored from checkpoints with set_skipped_steps), those in a
  // row up to the last step, and the number of ranks whose gradient was not finite at the last
  // step (0 when it was taken).
  int64_t skipped_steps() const { return skips_.total; }
  int64_t consecutive_skips() const { return skips_.consecutive; }
  void set_skipped_steps(int64_t total, int64_t consecutive) {
    skips_.total = total;
    skips_.consecutive = consecutive;
  }
  int last_bad_ranks() const { return skips_.last_bad_ranks; }

  int64_t iteration() const { return iteration_; }
  void set_iteration(int64_t iteration) { iteration_ = iteration; }
  // The learning rate the caller applies the directions of step `iteration` at: lr_t of the
  // schedule, or with options.lr_in_velocity the base lr (the schedule is then inside the
  // directions, lr_factor_at).
  double update_lr_at(int64_t iteration) const;
  // Density the next run() uses, and the iterations that are density warm-up.
  double density() const;
  // The density of the run() at `iteration` (density() is density_at_iteration(iteration())).
  double density_at_iteration(int64_t iteration) const;
  int64_t warmup_iterations() const;
  // Density of the dense-path group the next run() uses (1 unless DensePath::kGrouped).
  double dense_path_density() const;

  // The model's tensors with the path the policy gave them (all dense with kNone). The exchange's
  // own layout differs with kGrouped: the compressed tensors, then the dense-path group.
  const std::vector<TensorSpec>& layout() const { return layout_; }
  const OptimizerOptions& options() const { return options_; }
  const std::string& settings() const { return settings_; }
  comm::Communicator& communicator() { return comm_; }
  // Null with Compression::kNone. Its tensors: the compressed tensors in layout order, then,
  // with DensePath::kGrouped, the dense-path group (the dense-path tensors concatenated in layout
  // order).
  const Compressor* compressor() const { return compressor_.get(); }
  Compressor* compressor() { return compressor_.get(); }
  // kFloat16 / kBFloat16: this rank's rounding residual over the dense-path tensors concatenated
  // in layout order (what rounding has held back so far); empty otherwise.
  std::span<const float> dense_residual() const { return dense_path_.residual; }

  // What this rank selected at the last kept step, one Selection per compressor tensor (the
  // compressed tensors, then the dense-path group if grouped); empty with kNone.
  std::span<const Selection> last_selections() const { return tensors_.selections; }
  // The number of compressed tensors (the compressor's tensors before the dense-path group).
  size_t compressed_tensors() const { return routing_.compressed.size(); }
  // The positions the last run()'s exchange added into compressed tensor i's update
  // (Exchange::last_written: with allgather and direct, once per rank that selected the position),
  // and the algorithm the exchange runs (never kAuto).
  std::span<const uint64_t> last_written(size_t i) const { return exchange_->last_written(i); }
  ExchangeAlgorithm exchange_algorithm() const { return exchange_->algorithm(); }
  int world_size() const { return comm_.size(); }

  const ExchangeBytes& last_bytes() const { return exchange_->last(); }
  // The job's run id (from the exchange handshake) and whether its messages are authenticated.
  const RunId& run_id() const { return exchange_->run_id(); }
  bool authenticated() const { return exchange_->authenticated(); }
  const ExchangeBytes& total_bytes() const { return counters_.total; }
  const ExchangeBytes& post_warmup_bytes() const { return counters_.post_warmup; }
  void set_bytes(const ExchangeBytes& total, const ExchangeBytes& post_warmup) {
    counters_.total = total;
    counters_.post_warmup = post_warmup;
  }
  const StepTimings& last_timings() const { return counters_.timings; }

  // Every float buffer of this rank's state, by name: the dense-path momentum u
  // ("optimizer/momentum/<tensor>"), the weight-decay momentum b ("optimizer/decay_momentum/..."),
  // the compressor's momentum and velocity ("dgc/momentum/...", "dgc/velocity/..."; the
  // dense-path group is named "[dense-path group]"), the rounding residual
  // ("optimizer/dense_residual"). The spans stay valid until the next run() (a kept step swaps
  // the compressor's and the residual's buffers); writing through them changes the state.
  std::vector<NamedBuffer<float>> state_buffers();
  std::vector<NamedBuffer<const float>> state_buffers() const;
  // The compressor's RNG as text (empty with kNone), and its inverse (dgc::InvalidArgument when
  // malformed).
  std::string rng_state() const;
  void set_rng_state(const std::string& text);

  // `callback` is called by every run() once this rank's selections of the step are final (after
  // the compression, before the exchange), on the thread that runs the step; empty: none. The
  // pipelined optimizer takes its lookahead from them (for_each_selected).
  void on_selected(std::function<void()> callback) { on_selected_ = std::move(callback); }
  // This rank's selections of the last step, as f(tensor of the layout, element, value): the
  // velocity it sent, the update the step would apply on this rank alone. Valid from the
  // on_selected call until the next run(); nothing with Compression::kNone.
  void for_each_selected(const std::function<void(size_t, size_t, float)>& f) const;

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  }
  // Throws dgc::InvalidArgument unless there is one gradient, weight (and, unless `directions` is
  // empty, direction) per tensor of the layout, each of the tensor's size.
  void check_sizes(std::span<const std::span<float>> grads, std::span<const size_t> weights,
                   std::span<const size_t> directions) const;
  // Phases 1 to 4 of run() (timed from `start`): false when the step is skipped (its counters
  // advanced), true when it is kept (the state committed, the updates and the dense average
  // ready for phase 5).
  bool exchange_phases(std::span<const std::span<float>> grads, Clock::time_point start);
  // After phase 5 (or a skip): byte counters, the iteration, the update's time.
  void finish_step();
  // m, wd (with the learning-rate factor of this iteration) and Nesterov for phase 5.
  kernels::DirectionFactors direction_factors() const;
  // The factor run() at `iteration` scales the gradient (and the weight-decay term) by before they
  // enter the momentum: lr_t / lr with options.lr_in_velocity, else 1.
  double lr_factor_at(int64_t iteration) const;
  size_t group() const {
    return routing_.compressed.size();
  }  // the dense-path group's compressor index

  comm::Communicator& comm_;
  OptimizerOptions options_;
  std::string settings_;
  std::function<void()> on_selected_;
  std::vector<TensorSpec> layout_;

  // Where each tensor goes; fixed at construction.
  struct Routing {
    std::vector<size_t> compressed;  // indices into layout_ of the compressed tensors
    std::vector<size_t> dense;       // ... and of the dense-path tensors
    bool grouped = false;            // the dense path is the compressor's tensor group()
    bool global = false;             // SelectionScope::kGlobal: every tensor is in the group
    // The dense path's wire type: fp32 (exact average, or nothing when grouped), fp16 or bf16.
    ValueType dense_value_type = ValueType::kFloat32;
  } routing_;

  std::unique_ptr<Exchange> exchange_;
  std::unique_ptr<Compressor> compressor_;
  int64_t iteration_ = 0;

  // Per compressor tensor (the compressed tensors, then the dense-path group if grouped).
  struct TensorBuffers {
    std::vector<Selection> selections;
    std::vector<Selection> unapplied;  // what the exchange handed back, per compressed tensor
    std::vector<std::vector<float>> updates;
    std::vector<std::vector<float>> decay_momentum;  // weight-decay momentum b
  } tensors_;

  // The dense path: per dense tensor its ordinary momentum u (not when grouped) and its offset
  // in the flat buffer; with kFloat16 / kBFloat16 the rounding residual of the flat buffer, and
  // the one a step writes (swapped in when the step is kept).
  struct DensePathBuffers {
    std::vector<std::vector<float>> momentum;
    std::vector<size_t> offsets;
    std::vector<float> flat;
    std::vector<float> residual;
    std::vector<float> next_residual;
  } dense_path_;

  // run_and_apply(): where the tensors lie in each update buffer, and their weights at the
  // positions the exchange wrote.
  struct SparseApplyBuffers {
    std::vector<kernels::SparseApply::Segment> segments;
    kernels::SparseApply apply;
  } sparse_;
  Clock::time_point exchange_end_;

  // Steps skipped on non-finite gradients (--on-nonfinite skip).
  struct Skips {
    int64_t total = 0;
    int64_t consecutive = 0;
    int last_bad_ranks = 0;
  } skips_;

  // What the steps sent, and how long the last one took.
  struct Counters {
    ExchangeBytes total;
    ExchangeBytes post_warmup;
    StepTimings timings;
  } counters_;
};

}  // namespace dgc::train
