// Gradient buckets during the backward pass: the step of DistributedStep (step.h) driven bucket by
// bucket, each bucket's momentum correction, selection, encoding and exchange started on a
// communication thread as soon as its last gradient is ready, while the backward pass goes on.
// No libtorch: the libtorch optimizer (optimizer.h) calls gradient_ready() from autograd hooks,
// and `dgc bench step` from its replay of a backward pass.
//
// The plan (plan_buckets): the tensors in the reverse of the layout's order (the order a backward
// pass produces their gradients in; PyTorch DDP assigns its buckets the same way), cut into
// buckets of about cap_mb MB (2^20 bytes, fp32): a bucket closes as soon as it holds cap_mb or
// more, so a tensor larger than the cap is a bucket of its own. With DGC and the grouped dense
// path (DensePath::kGrouped) the dense-path tensors are not in those buckets but form one last
// bucket, the group: its selection runs over all of them at once. With options.last_bucket_cap_mb
// the last bucket of tensors, which can start only when the backward pass has ended, is cut down:
// its first layers up to that size form a bucket of their own. Buckets are exchanged in that
// order on the one communicator, each by a DistributedStep over its tensors with an Exchange (and
// a handshake) of its own.
//
// The same mathematics as one DistributedStep over every tensor, bit for bit, wherever selection
// is per tensor: every bucket's compressor starts its step from the RNG state the unbucketed step
// has when it reaches the bucket's first tensor (sampled selection draws once per compressed
// tensor with 0 < k < numel; bucket_rng_draws), and every tensor's sum over ranks is formed in
// rank order by the sparse exchange. One exception: the fp32 dense allreduce (the dense baseline,
// DensePath::kExact) is a ring whose order of summation depends on where an element falls in the
// buffer: bit for bit with 1 and 2 ranks, equal up to fp32 rounding with more.
//
// One message (one bucket, exactly DistributedStep::run) where a bucket cannot start before the
// whole gradient is known; one_message_reason() says why: global selection (every tensor is in
// the selection), clipping (it needs the norm of the whole gradient), --on-nonfinite skip (a
// skipped step must leave every bucket's state untouched), the 16-bit dense path (one residual
// over the whole dense path), the sparse-allreduce exchange (its re-selection), a cap of 0.
//
// Non-finite gradients (NonFinitePolicy::kStop): every bucket's exchange tells every rank whether
// a rank's gradient in that bucket was finite; all ranks stop with dgc::NumericError at the same
// bucket. Buckets before it have been committed: the run stops anyway, and resumes from a
// checkpoint.
//
// Collective: the constructor and every step (the gradient_ready() calls and finish(), or run())
// must be made by every rank in the same order. Thread-safety: gradient_ready() may be called from
// any one thread at a time (autograd's), the rest from the owner's thread; while a step is in
// flight (from its first gradient_ready() to finish()) the communicator belongs to the
// communication thread and the owner may not use it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dgc/train/step.h"

namespace dgc::train {

struct BucketPlan {
  // Layout indices of each bucket's tensors, in layout order; buckets in the order they are
  // exchanged.
  std::vector<std::vector<size_t>> buckets;
  // Why everything travels in one message (empty when there are buckets, or when one bucket
  // holds the whole model anyway).
  std::string one_message_reason;
};

// The buckets for `layout` (the paths as DistributedStep gives them) under `options`, on a world
// of `world` ranks.
BucketPlan plan_buckets(const std::vector<TensorSpec>& layout, const OptimizerOptions& options,
                        int world);

// The RNG draws a compressor's step of a tensor of `numel` elements at `density` makes: one with
// sampled selection and 0 < k < numel, else none.
uint64_t bucket_rng_draws(const CompressionOptions& options, int64_t numel, double density);

class BucketedStep {
 public:
  // Plans the buckets (options.bucket_cap_mb) and builds one DistributedStep per bucket (each runs
  // its handshake, over `run_settings` plus the cap). See DistributedStep's constructor.
  BucketedStep(comm::Communicator& comm,
               const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
               OptimizerOptions options, const std::string& run_settings = "");
  ~BucketedStep();
  BucketedStep(const BucketedStep&) = delete;
  BucketedStep& operator=(const BucketedStep&) = delete;

  // The gradient of tensor `t` (layout order) is final; its weight and where its direction goes.
  // The spans must stay valid until finish() returns. The first call of a step starts it; a
  // bucket's work starts (on the communication thread) once all its gradients are ready and every
  // bucket before it has started. Throws dgc::InvalidArgument for a tensor given twice in a step
  // or a span of the wrong size.
  void gradient_ready(size_t t, std::span<float> grad, std::span<const float> weight,
                      std::span<float> direction);
  // Waits for every bucket (every tensor must have been given), then returns as
  // DistributedStep::run does; rethrows what a bucket threw.
  bool finish();
  // One step with every gradient at once: DistributedStep::run with one bucket, else every
  // gradient_ready() in backward order and finish().
  bool run(std::span<const std::span<float>> grads, std::span<const std::span<const float>> weights,
           std::span<const std::span<float>> directions);
  // One bucket only: DistributedStep::run_and_apply over every tensor, the update applied to the
  // weights in the step's own pass (no directions stored), on the caller's thread.
  bool run_and_apply(std::span<const std::span<float>> grads,
                     std::span<const std::span<float>> weights);
  // With more than one bucket: called on the communication thread after each bucket's step was
  // taken, with the bucket's index (its directions are final; the caller may apply them while the
  // backward pass goes on, since no later part of it reads the bucket's weights). Set it before
  // the first step.
  void on_bucket_done(std::function<void(size_t)> callback) { bucket_done_ = std::move(callback); }
  // Whether a step is in flight (a gradient_ready() since the last finish()).
  bool in_flight() const;
  // Stops the communication thread once the bucket it runs (if any) has ended; a step in flight is
  // abandoned. For an owner that is going away while a step may be in flight (the spans it gave
  // die with it); the destructor does the same.
  void stop();

  size_t bucket_count() const { return steps_.size(); }
  const BucketPlan& plan() const { return plan_; }
  // The step of bucket b; with one bucket the whole model's.
  const DistributedStep& bucket(size_t b) const { return *steps_[b]; }
  DistributedStep& bucket(size_t b) { return *steps_[b]; }

  // As DistributedStep's (the iteration, schedules and options are every bucket's).
  int64_t iteration() const { return steps_[0]->iteration(); }
  void set_iteration(int64_t iteration);
  double update_lr_at(int64_t iteration) const { return steps_[0]->update_lr_at(iteration); }
  double density() const { return steps_[0]->density(); }
  int64_t warmup_iterations() const { return steps_[0]->warmup_iterations(); }
  double dense_path_density() const { return steps_[0]->dense_path_density(); }
  const std::vector<TensorSpec>& layout() const { return layout_; }
  const OptimizerOptions& options() const { return steps_[0]->options(); }
  // The settings of the whole step (step_settings(options, run_settings)), as with one bucket.
  const std::string& settings() const { return settings_; }
  int64_t skipped_steps() const { return steps_[0]->skipped_steps(); }
  int64_t consecutive_skips() const { return steps_[0]->consecutive_skips(); }
  void set_skipped_steps(int64_t total, int64_t consecutive);
  int last_bad_ranks() const { return steps_[0]->last_bad_ranks(); }
  // Whether any tensor is compressed (DGC), i.e. the state has a compressor and its RNG.
  bool compresses() const;
  const RunId& run_id() const { return steps_[0]->run_id(); }
  bool authenticated() const { return steps_[0]->authenticated(); }

  // Summed over the buckets.
  const ExchangeBytes& last_bytes() const { return last_bytes_; }
  const ExchangeBytes& total_bytes() const { return total_bytes_; }
  const ExchangeBytes& post_warmup_bytes() const { return post_warmup_bytes_; }
  void set_bytes(const ExchangeBytes& total, const ExchangeBytes& post_warmup);
  // The parts of the last step summed over the buckets (on the communication thread, overlapped
  // with the caller's backward pass), and `wait`: the seconds finish() waited for them (the part
  // of the step the backward pass did not hide).
  const StepTimings& last_timings() const { return timings_; }
  double last_wait_seconds() const { return wait_seconds_; }

  // Every bucket's state buffers (the names as with one bucket), and the RNG the unbucketed step
  // would hold (its text; empty without compression).
  std::vector<NamedBuffer<float>> state_buffers();
  std::vector<NamedBuffer<const float>> state_buffers() const;
  std::string rng_state() const;
  void set_rng_state(const std::string& text);

 private:
  void communication_loop();
  void run_bucket(size_t b);
  void ensure_thread();
  void plan_rng();
  void end_step_locked();  // no step in flight (under mutex_)
  // One bucket's step ended (started at `start`): its counters become the step's.
  bool one_bucket_done(bool taken, std::chrono::steady_clock::time_point start);

  BucketPlan plan_;
  std::vector<TensorSpec> layout_;
  std::string settings_;
  std::vector<std::unique_ptr<DistributedStep>> steps_;
  std::vector<size_t> bucket_of_;  // per tensor of the layout

  // Per step: the spans given so far, per bucket the gradients still missing.
  struct Given {
    std::vector<std::span<float>> grads;
    std::vector<std::span<const float>> weights;
    std::vector<std::span<float>> directions;
    std::vector<uint8_t> ready;
  } given_;
  std::vector<size_t> missing_;

  // The unbucketed step's RNG (bit for bit; see the file comment) at the start of the step.
  std::mt19937_64 rng_;
  // This step's draws per bucket, where they start in the unbucketed sequence, and their total.
  std::vector<uint64_t> rng_draws_, rng_offsets_;
  uint64_t rng_total_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::thread thread_;
  bool active_ = false;  // a step is in flight
  bool stop_ = false;
  size_t next_ = 0;  // the next bucket to run
  std::exception_ptr error_;
  std::vector<uint8_t> bucket_taken_;
  std::function<void(size_t)> bucket_done_;

  ExchangeBytes last_bytes_, total_bytes_, post_warmup_bytes_;
  StepTimings timings_;
  double wait_seconds_ = 0.0;
};

}  // namespace dgc::train
