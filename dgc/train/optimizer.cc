#include "dgc/train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include "dgc/core/bytes.h"
#include "dgc/core/clip.h"
#include "dgc/core/error.h"
#include "dgc/core/schedule.h"

namespace dgc::train {
namespace {

std::span<float> float_span(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> DistributedOptimizer::named_shapes(
    const std::vector<Param>& params) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& p : params) shapes.emplace_back(p.name, p.tensor.sizes().vec());
  return shapes;
}

std::vector<DistributedOptimizer::Param> DistributedOptimizer::collect_parameters(
    torch::nn::Module& model) {
  std::vector<Param> params;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    DGC_CHECK(p.scalar_type() == torch::kFloat32 && p.device().is_cpu() && p.is_contiguous(),
              "parameter '", item.key(), "' must be a contiguous float32 CPU tensor");
    params.push_back({item.key(), p});
  }
  return params;
}

DistributedOptimizer::DistributedOptimizer(comm::Communicator& comm, torch::nn::Module& model,
                                           OptimizerOptions options,
                                           const std::string& run_settings)
    : comm_(comm),
      model_(model),
      params_(collect_parameters(model)),
      step_(comm, named_shapes(params_), std::move(options), run_settings) {
  // Directions are stored only with buckets (one bucket applies them in the step's own pass), and
  // when pipelined (applied at the next step).
  if (step_.bucket_count() > 1 || pipelined()) {
    for (const auto& p : params_) directions_.emplace_back(static_cast<size_t>(p.tensor.numel()));
  }
  if (pipelined()) {
    check_pipeline(step_.options());
    // The step reads weights for weight decay and on the exact dense path; the lookahead
    // changes them meanwhile, so it reads a copy.
    const auto& o = step_.options();
    const bool reads_weights = o.weight_decay != 0.0 || o.compression == Compression::kNone ||
                               o.dense_path != DensePath::kGrouped;
    for (const auto& p : params_) {
      pipeline_grads_.emplace_back(static_cast<size_t>(p.tensor.numel()));
      if (reads_weights) pipeline_weights_.emplace_back(static_cast<size_t>(p.tensor.numel()));
    }
    step_.bucket(0).on_selected([this] { release_lookahead(true); });
    started_ = step_.iteration();
    finished_bytes_ = step_.total_bytes();
  }

  // The initial broadcast: every rank starts from rank 0's model.
  std::vector<std::span<float>> spans;
  for (auto& p : params_) spans.push_back(float_span(p.tensor));
  broadcast_parameters(comm_, spans, step_.options().timeout);
  synchronize_buffers();

  grads_.resize(params_.size());
  given_.assign(params_.size(), 0);
  if (step_.bucket_count() > 1) {
    // As DDP's reducer: a hook after the gradient accumulator of every parameter, which runs once
    // per backward pass when the parameter's .grad holds its gradient.
    for (size_t i = 0; i < params_.size(); ++i) {
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(params_[i].tensor);
      DGC_CHECK(accumulator != nullptr, "parameter '", params_[i].name,
                "' does not require a gradient");
      const uintptr_t key =
          accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [this, i](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list&) {
                gradient_ready(i);
                return outputs;
              }));
      hooks_.emplace_back(std::move(accumulator), key);
    }
    // Each bucket's weights are updated as soon as its directions are final, during backward.
    step_.on_bucket_done([this](size_t b) {
      const DistributedStep& bucket = step_.bucket(b);
      const auto lr = static_cast<float>(bucket.update_lr_at(bucket.iteration() - 1));
      for (const size_t i : step_.plan().buckets[b]) update_weight(i, lr);
    });
  }
}

void DistributedOptimizer::update_weight(size_t i, float lr) {
  float* w = params_[i].tensor.data_ptr<float>();
  const float* d = directions_[i].data();
  const size_t n = directions_[i].size();
  for (size_t e = 0; e < n; ++e) w[e] -= lr * d[e];
}

DistributedOptimizer::~DistributedOptimizer() {
  if (in_flight_.valid()) in_flight_.wait();  // its error, if any, is no one's any more
  undo_lookahead();  // the model outlives us: its weights as the last applied step left them
  for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
  step_.stop();  // before the gradients and directions it may still read go
}

void DistributedOptimizer::gradient_ready(size_t i) {
  DGC_CHECK_LT(i, params_.size(), "parameter index");
  torch::Tensor g = params_[i].tensor.grad();
  if (!g.defined()) {
    g = torch::zeros_like(params_[i].tensor);
  } else {
    DGC_CHECK(g.scalar_type() == torch::kFloat32 && g.device().is_cpu(), "gradient of '",
              params_[i].name, "' must be float32 on the CPU");
    g = g.contiguous();
  }
  DGC_CHECK(!given_[i], "the gradient of '", params_[i].name,
            "' was handed to the step twice: with gradient buckets every backward pass must be "
            "followed by one step() (or set --bucket-cap-mb 0)");
  given_[i] = 1;
  grads_[i] = g;
  if (step_.bucket_count() > 1) {
    step_.gradient_ready(i, float_span(g), float_span(params_[i].tensor), directions_[i]);
  }
}

double DistributedOptimizer::learning_rate() const {
  return lr_at(options().lr, iteration(), options().iterations_per_epoch);
}

double DistributedOptimizer::density() const {
  // Pipelined, the step in flight moves the step's own iteration: the density at ours.
  return pipelined() ? step_.bucket(0).density_at_iteration(iteration()) : step_.density();
}

int64_t DistributedOptimizer::warmup_iterations() const { return step_.warmup_iterations(); }

bool DistributedOptimizer::step() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // Backward order: what no hook gave (all of it without buckets).
  for (size_t i = params_.size(); i-- > 0;) {
    if (!given_[i]) gradient_ready(i);
  }
  std::fill(given_.begin(), given_.end(), uint8_t{0});
  if (pipelined()) return pipelined_step();
  const auto run_start = Clock::now();
  if (step_.bucket_count() == 1) {
    // The step and the update w -= lr * direction at the step's learning rate in one pass
    // (skipped on every rank: the weights stay as they are).
    std::vector<std::span<float>> grad_spans, weight_spans;
    for (size_t i = 0; i < params_.size(); ++i) {
      grad_spans.push_back(float_span(grads_[i]));
      weight_spans.push_back(float_span(params_[i].tensor));
    }
    torch::NoGradGuard no_grad;
    bool taken = false;
    try {
      taken = step_.run_and_apply(grad_spans, weight_spans);
    } catch (...) {
      for (auto& g : grads_) g = torch::Tensor();
      throw;
    }
    for (auto& g : grads_) g = torch::Tensor();
    const auto& t = step_.last_timings();
    timings_.compress = std::chrono::duration<double>(run_start - start).count() + t.compress;
    timings_.exchange = t.exchange;
    timings_.update = t.update;
    return taken;
  }
  bool taken = false;
  try {
    taken = step_.finish();
  } catch (...) {
    for (auto& g : grads_) g = torch::Tensor();
    throw;
  }
  for (auto& g : grads_) g = torch::Tensor();
  const auto update_start = Clock::now();
  const auto& t = step_.last_timings();
  if (!taken) {
    // Skipped on every rank: the weights stay as they are (the directions are zero).
    timings_.compress = std::chrono::duration<double>(run_start - start).count() + t.compress;
    timings_.exchange = t.exchange;
    timings_.update = t.update;
    return false;
  }

  // (With buckets each bucket's weights were updated when it was done.)
  timings_.compress = std::chrono::duration<double>(run_start - start).count() + t.compress;
  timings_.exchange = t.exchange;
  timings_.update = t.update + std::chrono::duration<double>(Clock::now() - update_start).count();
  return true;
}

void DistributedOptimizer::flush() {
  if (!in_flight_.valid()) return;
  bool taken = false;
  try {
    taken = in_flight_.get();
  } catch (...) {
    undo_lookahead();
    started_ = step_.iteration();
    finished_bytes_ = step_.total_bytes();
    throw;
  }
  undo_lookahead();
  if (taken) {
    const auto lr = static_cast<float>(step_.update_lr_at(in_flight_iteration_));
    for (size_t i = 0; i < params_.size(); ++i) update_weight(i, lr);
  }
  finished_bytes_ = step_.total_bytes();
  const auto& t = step_.last_timings();
  timings_.compress = t.compress;
  timings_.exchange = t.exchange;
  timings_.update = t.update;
}

void DistributedOptimizer::undo_lookahead() {
  for (auto it = lookahead_.rbegin(); it != lookahead_.rend(); ++it) {
    float_span(params_[it->tensor].tensor)[it->element] = it->value;
  }
  lookahead_.clear();
}

void DistributedOptimizer::release_lookahead(bool selected) {
  if (selected_released_) return;
  selected_released_ = true;
  selected_ready_ = selected;
  selected_.set_value();
}

bool DistributedOptimizer::pipelined_step() {
  // Step t-1's update first (its lookahead undone): step t's weight decay reads the weights with
  // it, as a synchronous step t would.
  flush();
  for (size_t i = 0; i < params_.size(); ++i) {
    const float* g = grads_[i].data_ptr<float>();
    std::copy(g, g + pipeline_grads_[i].size(), pipeline_grads_[i].begin());
    grads_[i] = torch::Tensor();
    if (!pipeline_weights_.empty()) {
      const auto w = float_span(params_[i].tensor);
      std::copy(w.begin(), w.end(), pipeline_weights_[i].begin());
    }
  }
  in_flight_iteration_ = step_.iteration();
  ++started_;
  selected_ = std::promise<void>();
  selected_released_ = false;
  selected_ready_ = false;
  std::future<void> selected = selected_.get_future();
  in_flight_ = std::async(std::launch::async, [this] {
    // However the step ends, step() stops waiting for its selections.
    struct Release {
      DistributedOptimizer& optimizer;
      ~Release() { optimizer.release_lookahead(false); }
    } release{*this};
    std::vector<std::span<float>> grads, directions;
    std::vector<std::span<const float>> weights;
    for (size_t i = 0; i < params_.size(); ++i) {
      grads.emplace_back(pipeline_grads_[i]);
      weights.emplace_back(pipeline_weights_.empty()
                               ? std::span<const float>(float_span(params_[i].tensor))
                               : std::span<const float>(pipeline_weights_[i]));
      directions.emplace_back(directions_[i]);
    }
    return step_.run(grads, weights, directions);
  });
  // The lookahead: this rank's selection, applied at the step's learning rate, predicts the
  // update in flight (the ranks' average of their selections) while the exchange runs.
  selected.wait();
  if (selected_ready_) {
    const auto lr = static_cast<float>(step_.update_lr_at(in_flight_iteration_));
    step_.bucket(0).for_each_selected([&](size_t t, size_t e, float value) {
      float& w = float_span(params_[t].tensor)[e];
      lookahead_.push_back({t, e, w});
      w -= lr * value;
    });
  }
  return true;
}

void DistributedOptimizer::synchronize_buffers() {
  flush();
  std::vector<torch::Tensor> buffers;
  size_t bytes = 0;
  for (const auto& b : model_.buffers(/*recurse=*/true)) {
    DGC_CHECK(b.device().is_cpu() && b.is_contiguous(),
              "module buffers must be contiguous on the CPU");
    buffers.push_back(b);
    bytes += b.nbytes();
  }
  if (bytes == 0 || comm_.size() == 1) return;
  std::vector<uint8_t> packed(bytes);
  size_t offset = 0;
  for (const auto& b : buffers) {
    std::memcpy(packed.data() + offset, b.data_ptr(), b.nbytes());
    offset += b.nbytes();
  }
  comm_.broadcast(packed, 0, options().timeout);
  offset = 0;
  for (auto& b : buffers) {
    std::memcpy(b.data_ptr(), packed.data() + offset, b.nbytes());
    offset += b.nbytes();
  }
}

void DistributedOptimizer::check_agreement() {
  flush();
  uint8_t mine[8];
  store_le(mine, static_cast<uint64_t>(iteration()));
  const auto all = comm_.allgatherv(mine, options().timeout);
  for (size_t r = 0; r < all.size(); ++r) {
    DGC_CHECK_EQ(all[r].size(), 8u, "iteration message from rank ", r);
    const uint64_t theirs = load_le<uint64_t>(all[r].data());
    if (theirs != static_cast<uint64_t>(iteration())) {
      throw MismatchError(
          detail::concat("rank ", r, " is at iteration ", theirs, " but rank ", comm_.rank(),
                         " is at ", iteration(),
                         ": the per-rank checkpoint files come from different steps (a run stopped "
                         "while writing them?); start a new run without --resume"));
    }
  }
}

void DistributedOptimizer::save(CheckpointFile& file) const {
  DGC_CHECK(!in_flight_.valid(), "save() while a pipelined step is in flight: flush() first");
  file.put_text("optimizer/settings", settings());
  file.put_text("optimizer/world_size", std::to_string(comm_.size()));
  file.put_text("optimizer/rank", std::to_string(comm_.rank()));
  file.put_text("optimizer/iteration", std::to_string(iteration()));
  file.put_text("optimizer/bytes_total", bytes_text(total_bytes()));
  file.put_text("optimizer/bytes_post_warmup", bytes_text(post_warmup_bytes()));
  file.put_text("optimizer/skipped_steps", std::to_string(step_.skipped_steps()));
  file.put_text("optimizer/consecutive_skips", std::to_string(step_.consecutive_skips()));
  for (const auto& p : params_) {
    file.put_array("model/param/" + p.name, "float32", p.tensor.sizes().vec(), p.tensor.data_ptr(),
                   p.tensor.nbytes());
  }
  for (const auto& item : model_.named_buffers(/*recurse=*/true)) {
    const auto& b = item.value();
    file.put_array("model/buffer/" + item.key(), c10::toString(b.scalar_type()), b.sizes().vec(),
                   b.data_ptr(), b.nbytes());
  }
  for (const auto& buffer : step_.state_buffers()) {
    file.put_floats(buffer.name, buffer.values);
  }
  if (step_.compresses()) file.put_text("dgc/rng", step_.rng_state());
}

void DistributedOptimizer::load(const CheckpointFile& file) {
  const std::string& path = file.path();
  const int64_t world = read_int(file, "optimizer/world_size");
  if (world != comm_.size()) {
    throw DataError(detail::concat("checkpoint ", path, " was written by a run with ", world,
                                   " workers, this run has ", comm_.size(),
                                   ": resume with the same number of workers"));
  }
  const int64_t rank = read_int(file, "optimizer/rank");
  if (rank != comm_.rank()) {
    throw DataError(detail::concat("checkpoint ", path, " belongs to rank ", rank, ", not to rank ",
                                   comm_.rank()));
  }
  const std::string stored = file.text("optimizer/settings");
  if (stored != settings()) {
    std::string difference = describe_settings_difference(stored, settings());
    if (difference.empty()) difference = "the settings differ";
    throw DataError("checkpoint " + path + " was written by a run with other settings: " +
                    difference + ". Resume with the same flags, or start a new run");
  }

  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    file.get_floats("model/param/" + p.name, float_span(p.tensor));
  }
  for (const auto& item : model_.named_buffers(/*recurse=*/true)) {
    const auto& b = item.value();
    const auto& record = file.get("model/buffer/" + item.key());
    if (record.dtype != c10::toString(b.scalar_type()) || record.data.size() != b.nbytes()) {
      throw DataError(detail::concat("checkpoint ", path, ": buffer '", item.key(),
                                     "' has another type or size; it was written for another "
                                     "model"));
    }
    std::memcpy(b.data_ptr(), record.data.data(), b.nbytes());
  }
  for (const auto& buffer : step_.state_buffers()) file.get_floats(buffer.name, buffer.values);
  if (step_.compresses()) {
    try {
      step_.set_rng_state(file.text("dgc/rng"));
    } catch (const InvalidArgument&) {
      throw DataError("checkpoint " + path + ": record 'dgc/rng' is malformed");
    }
  }
  step_.set_iteration(read_int(file, "optimizer/iteration"));
  step_.set_bytes(read_bytes(file, "optimizer/bytes_total"),
                  read_bytes(file, "optimizer/bytes_post_warmup"));
  // Absent in checkpoints written before the skip policy: none skipped.
  if (file.has("optimizer/skipped_steps")) {
    step_.set_skipped_steps(read_int(file, "optimizer/skipped_steps"),
                            read_int(file, "optimizer/consecutive_skips"));
  }
}

}  // namespace dgc::train
