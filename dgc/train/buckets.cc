#include "dgc/train/buckets.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>

#include "dgc/core/error.h"
#include "dgc/core/selection.h"
#include "dgc/exchange/algorithm.h"
#include "dgc/exchange/layout.h"

namespace dgc::train {
namespace {

bool grouped_dense_path(const std::vector<TensorSpec>& layout, const OptimizerOptions& options) {
  if (options.compression != Compression::kDgc || options.dense_path != DensePath::kGrouped)
    return false;
  return std::any_of(layout.begin(), layout.end(),
                     [](const TensorSpec& t) { return t.path == TensorPath::kDense; });
}

uint64_t compressed_numel(const std::vector<TensorSpec>& layout) {
  uint64_t numel = 0;
  for (const auto& t : layout) {
    if (t.path == TensorPath::kCompressed) numel += static_cast<uint64_t>(t.numel());
  }
  return numel;
}

// The exchange algorithm every bucket runs: `auto` resolved once for the whole model, so that
// every bucket runs what the unbucketed step would.
ExchangeAlgorithm bucket_algorithm(const std::vector<TensorSpec>& layout,
                                   const OptimizerOptions& options, int world) {
  if (options.exchange != ExchangeAlgorithm::kAuto) return options.exchange;
  return choose_algorithm(world, options.density.after_warmup, compressed_numel(layout));
}

std::string one_message_reason(const std::vector<TensorSpec>& layout,
                               const OptimizerOptions& options, int world) {
  const bool dgc = options.compression == Compression::kDgc;
  if (options.bucket_cap_mb <= 0) return "gradient buckets are off (--bucket-cap-mb 0)";
  if (options.pipeline != 0)
    return "the pipelined step (--pipeline 1) overlaps the whole exchange with the next step's "
           "compute";
  if (dgc && options.selection_scope == SelectionScope::kGlobal)
    return "global selection (--selection-scope global) needs every tensor";
  if (options.clip_norm > 0) return "clipping (--clip-norm) needs the norm of the whole gradient";
  if (options.on_nonfinite == NonFinitePolicy::kSkip)
    return "--on-nonfinite skip must leave every bucket's state untouched";
  if (dgc &&
      (options.dense_path == DensePath::kFloat16 || options.dense_path == DensePath::kBFloat16))
    return "the 16-bit dense path keeps one residual over the whole dense path";
  if (dgc && bucket_algorithm(layout, options, world) == ExchangeAlgorithm::kSparseAllreduce)
    return "the sparse-allreduce exchange re-selects over the whole model";
  return "";
}

}  // namespace

uint64_t bucket_rng_draws(const CompressionOptions& options, int64_t numel, double density) {
  if (options.selection.method != SelectionMethod::kSampled || numel <= 0) return 0;
  const auto n = static_cast<size_t>(numel);
  const size_t k = std::min(target_count(n, density), n);
  return k > 0 && k < n ? 1 : 0;
}

BucketPlan plan_buckets(const std::vector<TensorSpec>& layout, const OptimizerOptions& options,
                        int world) {
  BucketPlan plan;
  plan.one_message_reason = one_message_reason(layout, options, world);
  if (!plan.one_message_reason.empty()) {
    std::vector<size_t> all(layout.size());
    for (size_t t = 0; t < all.size(); ++t) all[t] = t;
    plan.buckets.push_back(std::move(all));
    return plan;
  }
  const bool grouped = grouped_dense_path(layout, options);
  const double cap_bytes = options.bucket_cap_mb * 1024.0 * 1024.0;
  const auto tensor_bytes = [&](size_t t) { return 4.0 * static_cast<double>(layout[t].numel()); };
  std::vector<size_t> group, current;
  double bytes = 0.0;
  for (size_t r = layout.size(); r-- > 0;) {
    if (grouped && layout[r].path == TensorPath::kDense) {
      group.push_back(r);
      continue;
    }
    current.push_back(r);
    bytes += tensor_bytes(r);
    if (bytes >= cap_bytes) {
      plan.buckets.push_back(std::move(current));
      current.clear();
      bytes = 0.0;
    }
  }
  if (!current.empty()) plan.buckets.push_back(std::move(current));
  // The last bucket of tensors waits for the first layer's gradient: keep it small, so that what
  // remains after the backward pass is little.
  const double last_cap_bytes = options.last_bucket_cap_mb * 1024.0 * 1024.0;
  const auto bucket_bytes = [&](const std::vector<size_t>& bucket) {
    double total = 0.0;
    for (const size_t t : bucket) total += tensor_bytes(t);
    return total;
  };
  if (last_cap_bytes > 0 && !plan.buckets.empty() && plan.buckets.back().size() > 1 &&
      bucket_bytes(plan.buckets.back()) > last_cap_bytes) {
    std::vector<size_t>& last = plan.buckets.back();  // backward order: its first layer at the end
    double tail_bytes = 0.0;
    size_t keep = last.size();
    while (keep > 1 && tail_bytes + tensor_bytes(last[keep - 1]) <= last_cap_bytes) {
      tail_bytes += tensor_bytes(last[keep - 1]);
      --keep;
    }
    if (keep == last.size()) --keep;  // its first tensor alone is over the cap
    std::vector<size_t> tail(last.begin() + static_cast<std::ptrdiff_t>(keep), last.end());
    last.resize(keep);
    plan.buckets.push_back(std::move(tail));
  }
  if (!group.empty()) plan.buckets.push_back(std::move(group));
  for (auto& bucket : plan.buckets) std::reverse(bucket.begin(), bucket.end());
  return plan;
}

BucketedStep::BucketedStep(
    comm::Communicator& comm,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
    OptimizerOptions options, const std::string& run_settings) {
  DGC_CHECK(!named_shapes.empty(), "the model has no parameters");
  DGC_CHECK_GE(options.bucket_cap_mb, 0.0, "bucket cap (--bucket-cap-mb), MB");
  DGC_CHECK_GE(options.last_bucket_cap_mb, 0.0, "last bucket cap (--last-bucket-cap-mb), MB");
  settings_ = step_settings(options, run_settings);
  layout_ = make_layout(named_shapes, options.policy);
  const bool dgc = options.compression == Compression::kDgc;
  for (auto& t : layout_) {
    if (!dgc || options.selection_scope == SelectionScope::kGlobal) t.path = TensorPath::kDense;
  }
  plan_ = plan_buckets(layout_, options, comm.size());
  if (plan_.buckets.size() == 1) {
    steps_.push_back(std::make_unique<DistributedStep>(comm, named_shapes, options, run_settings));
    layout_ = steps_[0]->layout();
  } else {
    OptimizerOptions bucket_options = options;
    bucket_options.exchange = bucket_algorithm(layout_, options, comm.size());
    std::string settings = run_settings;
    if (!settings.empty() && settings.back() != '\n') settings += '\n';
    settings += detail::concat("bucket_cap_mb=", options.bucket_cap_mb,
                               "\nlast_bucket_cap_mb=", options.last_bucket_cap_mb,
                               "\nbuckets=", plan_.buckets.size(), "\n");
    for (size_t b = 0; b < plan_.buckets.size(); ++b) {
      std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
      for (const size_t t : plan_.buckets[b]) shapes.push_back(named_shapes[t]);
      steps_.push_back(std::make_unique<DistributedStep>(comm, shapes, bucket_options,
                                                         settings + detail::concat("bucket=", b)));
    }
    for (const auto& step : steps_) {
      if (step->compressor() != nullptr) {
        rng_ = step->compressor()->rng();
        break;
      }
    }
  }
  bucket_of_.assign(layout_.size(), 0);
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    for (const size_t t : plan_.buckets[b]) bucket_of_[t] = b;
  }
  given_.grads.resize(layout_.size());
  given_.weights.resize(layout_.size());
  given_.directions.resize(layout_.size());
  given_.ready.assign(layout_.size(), 0);
  for (const auto& bucket : plan_.buckets) missing_.push_back(bucket.size());
  bucket_taken_.assign(steps_.size(), 0);
}

BucketedStep::~BucketedStep() { stop(); }

void BucketedStep::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Ready for a new step (a later gradient_ready() starts the thread again).
  std::lock_guard<std::mutex> lock(mutex_);
  stop_ = false;
  error_ = nullptr;
  end_step_locked();
}

void BucketedStep::end_step_locked() {
  std::fill(given_.ready.begin(), given_.ready.end(), uint8_t{0});
  for (size_t b = 0; b < steps_.size(); ++b) missing_[b] = plan_.buckets[b].size();
  next_ = 0;
  active_ = false;
}

bool BucketedStep::compresses() const {
  return std::any_of(steps_.begin(), steps_.end(),
                     [](const auto& step) { return step->compressor() != nullptr; });
}

bool BucketedStep::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

void BucketedStep::set_iteration(int64_t iteration) {
  for (auto& step : steps_) step->set_iteration(iteration);
}

void BucketedStep::set_skipped_steps(int64_t total, int64_t consecutive) {
  for (auto& step : steps_) step->set_skipped_steps(total, consecutive);
}

void BucketedStep::set_bytes(const ExchangeBytes& total, const ExchangeBytes& post_warmup) {
  total_bytes_ = total;
  post_warmup_bytes_ = post_warmup;
  if (steps_.size() == 1) steps_[0]->set_bytes(total, post_warmup);
}

void BucketedStep::gradient_ready(size_t t, std::span<float> grad, std::span<const float> weight,
                                  std::span<float> direction) {
  DGC_CHECK_LT(t, layout_.size(), "tensor index");
  const auto n = static_cast<size_t>(layout_[t].numel());
  DGC_CHECK(grad.size() == n && weight.size() == n && direction.size() == n, "tensor '",
            layout_[t].name, "' has ", n, " elements but its gradient, weight and direction have ",
            grad.size(), ", ", weight.size(), " and ", direction.size());
  if (steps_.size() > 1) ensure_thread();
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DGC_CHECK(!given_.ready[t], "the gradient of tensor '", layout_[t].name,
              "' was given twice in one step: with gradient buckets every backward pass must be "
              "followed by one optimizer step (or set --bucket-cap-mb 0)");
    given_.grads[t] = grad;
    given_.weights[t] = weight;
    given_.directions[t] = direction;
    given_.ready[t] = 1;
    if (!active_ && steps_.size() > 1) plan_rng();
    active_ = true;
    notify = --missing_[bucket_of_[t]] == 0;
  }
  if (notify) cv_.notify_all();
}

void BucketedStep::ensure_thread() {
  if (!thread_.joinable()) thread_ = std::thread([this] { communication_loop(); });
}

void BucketedStep::communication_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock,
             [&] { return stop_ || (active_ && next_ < steps_.size() && missing_[next_] == 0); });
    if (stop_) return;
    const size_t b = next_;
    const bool failed = error_ != nullptr;
    lock.unlock();
    std::exception_ptr error;
    if (!failed) {
      try {
        run_bucket(b);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (error) error_ = error;
    ++next_;
    cv_.notify_all();
  }
}

void BucketedStep::plan_rng() {
  // Per bucket the draws of its step, and where they start in the unbucketed step's sequence: the
  // compressed tensors in layout order, then the dense-path group.
  const size_t buckets = steps_.size();
  rng_draws_.assign(buckets, 0);
  rng_offsets_.assign(buckets, 0);
  std::vector<size_t> key(buckets, std::numeric_limits<size_t>::max());
  for (size_t b = 0; b < buckets; ++b) {
    const DistributedStep& s = *steps_[b];
    const Compressor* compressor = s.compressor();
    if (compressor == nullptr) continue;
    const auto& options = compressor->options();
    for (size_t i = 0; i < s.compressed_tensors(); ++i) {
      rng_draws_[b] += bucket_rng_draws(
          options, static_cast<int64_t>(compressor->velocity(i).size()), s.density());
    }
    if (compressor->num_tensors() > s.compressed_tensors()) {
      const auto group = static_cast<int64_t>(compressor->velocity(s.compressed_tensors()).size());
      rng_draws_[b] += bucket_rng_draws(options, group, s.dense_path_density());
    }
    if (s.compressed_tensors() > 0) key[b] = plan_.buckets[b][0];
  }
  rng_total_ = 0;
  for (size_t b = 0; b < buckets; ++b) {
    rng_total_ += rng_draws_[b];
    for (size_t c = 0; c < buckets; ++c) {
      if (c != b && key[c] < key[b]) rng_offsets_[b] += rng_draws_[c];
    }
  }
}

void BucketedStep::run_bucket(size_t b) {
  DistributedStep& step = *steps_[b];
  if (step.compressor() != nullptr) {
    std::mt19937_64 rng = rng_;
    rng.discard(rng_offsets_[b]);
    step.compressor()->rng() = rng;
  }
  std::vector<std::span<float>> grads, directions;
  std::vector<std::span<const float>> weights;
  for (const size_t t : plan_.buckets[b]) {
    grads.push_back(given_.grads[t]);
    weights.push_back(given_.weights[t]);
    directions.push_back(given_.directions[t]);
  }
  bucket_taken_[b] = step.run(grads, weights, directions) ? 1 : 0;
  if (step.compressor() != nullptr && bucket_taken_[b]) {
    std::mt19937_64 expected = rng_;
    expected.discard(rng_offsets_[b] + rng_draws_[b]);
    DGC_CHECK(step.compressor()->rng() == expected, "bucket ", b,
              " drew another number of random numbers than its plan: the bucketed step would "
              "differ from the unbucketed one (bucket_rng_draws is out of date)");
  }
  if (bucket_done_ && bucket_taken_[b]) bucket_done_(b);
}

bool BucketedStep::finish() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  bool taken = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t t = 0; t < layout_.size(); ++t) {
      DGC_CHECK(given_.ready[t], "finish() before the gradient of tensor '", layout_[t].name,
                "' was given");
    }
  }
  if (steps_.size() == 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    end_step_locked();
  } else {
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return next_ == steps_.size(); });
      end_step_locked();
      error = error_;
      error_ = nullptr;
    }
    wait_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
    if (error) std::rethrow_exception(error);
    last_bytes_ = ExchangeBytes{};
    timings_ = StepTimings{};
    for (size_t b = 0; b < steps_.size(); ++b) {
      last_bytes_ += steps_[b]->last_bytes();
      timings_.compress += steps_[b]->last_timings().compress;
      timings_.exchange += steps_[b]->last_timings().exchange;
      timings_.update += steps_[b]->last_timings().update;
      taken = taken && bucket_taken_[b];
    }
    rng_.discard(rng_total_);
    total_bytes_ += last_bytes_;
    if (iteration() - 1 >= warmup_iterations()) post_warmup_bytes_ += last_bytes_;
    return taken;
  }
  // One bucket: the whole step on the caller's thread, exactly DistributedStep::run.
  taken = steps_[0]->run(given_.grads, given_.weights, given_.directions);
  return one_bucket_done(taken, start);
}

bool BucketedStep::run(std::span<const std::span<float>> grads,
                       std::span<const std::span<const float>> weights,
                       std::span<const std::span<float>> directions) {
  DGC_CHECK_EQ(grads.size(), layout_.size(), "gradients (one per tensor of the layout)");
  DGC_CHECK_EQ(weights.size(), layout_.size(), "weights (one per tensor of the layout)");
  DGC_CHECK_EQ(directions.size(), layout_.size(), "directions (one per tensor of the layout)");
  for (size_t t = layout_.size(); t-- > 0;) gradient_ready(t, grads[t], weights[t], directions[t]);
  return finish();
}

std::vector<NamedBuffer<float>> BucketedStep::state_buffers() {
  std::vector<NamedBuffer<float>> buffers;
  for (auto& step : steps_) {
    for (auto& b : step->state_buffers()) buffers.push_back(std::move(b));
  }
  return buffers;
}

std::vector<NamedBuffer<const float>> BucketedStep::state_buffers() const {
  std::vector<NamedBuffer<const float>> buffers;
  for (const auto& step : steps_) {
    for (auto& b : static_cast<const DistributedStep&>(*step).state_buffers())
      buffers.push_back(std::move(b));
  }
  return buffers;
}

std::string BucketedStep::rng_state() const {
  if (steps_.size() == 1) return steps_[0]->rng_state();
  if (!compresses()) return "";
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void BucketedStep::set_rng_state(const std::string& text) {
  if (steps_.size() == 1) {
    steps_[0]->set_rng_state(text);
    return;
  }
  if (!compresses()) return;
  std::istringstream in(text);
  std::mt19937_64 rng;
  in >> rng;
  if (!in) throw InvalidArgument("the compressor's RNG state is malformed");
  rng_ = rng;
}

}  // namespace dgc::train
