#include "dgc/train/step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "dgc/core/clip.h"
#include "dgc/core/error.h"
#include "dgc/core/schedule.h"
#include "dgc/train/step_kernels.h"

namespace dgc::train {
namespace {

// A distinct sampling stream per rank from the shared seed.
uint64_t rank_seed(uint64_t seed, int rank) {
  return seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1));
}

// The dense-path group's name in the exchange's layout and in checkpoints.
constexpr const char* kDensePathGroup = "[dense-path group]";

}  // namespace

std::string step_settings(const OptimizerOptions& options, const std::string& run_settings) {
  std::string settings = describe(options) + run_settings;
  if (!settings.empty() && settings.back() != '\n') settings += '\n';
  return settings;
}

ExchangeOptions exchange_options_of(const OptimizerOptions& options, const std::string& settings) {
  ExchangeOptions exchange_options;
  exchange_options.value_type = options.compressor.value_type;
  exchange_options.timeout = options.timeout;
  exchange_options.settings = settings;
  exchange_options.algorithm = options.exchange;
  exchange_options.density = options.density.after_warmup;
  exchange_options.message_key = options.message_key;
  return exchange_options;
}

void check_nonfinite_step(const OptimizerOptions& options, int bad_ranks, int world,
                          int64_t iteration, bool local_ok, int64_t consecutive_skips,
                          const char* limit_name, const char* remedy) {
  const std::string what = detail::concat(
      "non-finite gradient (NaN or Inf) on ", bad_ranks, " of ", world, " rank(s) at iteration ",
      iteration, " (epoch ", iteration / options.iterations_per_epoch + 1,
      "); this rank's gradient was ", local_ok ? "finite" : "not finite", ". ");
  if (options.on_nonfinite != NonFinitePolicy::kSkip) {
    throw NumericError(what + "Nothing was applied. " + remedy);
  }
  if (consecutive_skips >= options.max_consecutive_skips) {
    throw NumericError(
        detail::concat(what, "Nothing was applied, and the run stops: ", consecutive_skips + 1,
                       " bad steps in a row, more than the ", options.max_consecutive_skips,
                       " skips in a row ", limit_name, " allows (the run diverges). ", remedy));
  }
}

DistributedStep::DistributedStep(
    comm::Communicator& comm,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
    OptimizerOptions options, const std::string& run_settings)
    : comm_(comm), options_(std::move(options)) {
  DGC_CHECK_GE(options_.iterations_per_epoch, 1, "iterations per epoch");
  check_density(options_.density.after_warmup);
  check_density(options_.dense_path_density, "dense-path density");
  DGC_CHECK_GE(options_.weight_decay, 0.0, "weight decay");
  DGC_CHECK_GE(options_.compressor.momentum.factor, 0.0, "momentum");
  DGC_CHECK(!named_shapes.empty(), "the model has no parameters");
  DGC_CHECK(!options_.lr_in_velocity ||
                (options_.compression == Compression::kDgc && options_.lr.base > 0),
            "the learning rate inside the velocity (--lr-in-velocity) needs DGC and a base "
            "learning rate above 0");
  DGC_CHECK(options_.max_consecutive_skips >= 1,
            "the most steps skipped in a row (--max-consecutive-skips) must be at least 1, got ",
            options_.max_consecutive_skips);

  const bool dgc = options_.compression == Compression::kDgc;
  routing_.global = dgc && options_.selection_scope == SelectionScope::kGlobal;
  DGC_CHECK(!routing_.global || options_.dense_path == DensePath::kGrouped,
            "global selection (--selection-scope global) steps every tensor as the grouped dense "
            "path and needs --dense-path grouped, got --dense-path ",
            to_string(options_.dense_path));
  layout_ = make_layout(named_shapes, options_.policy);
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (!dgc || routing_.global) layout_[t].path = TensorPath::kDense;
    (layout_[t].path == TensorPath::kCompressed ? routing_.compressed : routing_.dense)
        .push_back(t);
  }
  routing_.grouped = dgc && options_.dense_path == DensePath::kGrouped && !routing_.dense.empty();
  size_t dense_numel = 0;
  for (const size_t t : routing_.dense) {
    const auto n = static_cast<size_t>(layout_[t].numel());
    dense_path_.offsets.push_back(dense_numel);
    if (!routing_.grouped) dense_path_.momentum.emplace_back(n, 0.0f);
    dense_numel += n;
  }
  dense_path_.flat.assign(dense_numel, 0.0f);
  settings_ = step_settings(options_, run_settings);

  ExchangeOptions exchange_options = exchange_options_of(options_, settings_);
  std::vector<TensorSpec> exchange_layout;
  if (routing_.grouped) {
    // The compressed tensors, then the dense-path group in their place.
    for (const size_t t : routing_.compressed) exchange_layout.push_back(layout_[t]);
    exchange_layout.push_back(
        TensorSpec{kDensePathGroup, {static_cast<int64_t>(dense_numel)}, TensorPath::kCompressed});
    exchange_options.dense_path_group = routing_.compressed.size();
  } else {
    exchange_layout = layout_;
  }
  if (dgc && options_.dense_path == DensePath::kFloat16) {
    routing_.dense_value_type = ValueType::kFloat16;
  } else if (dgc && options_.dense_path == DensePath::kBFloat16) {
    routing_.dense_value_type = ValueType::kBFloat16;
  }
  exchange_options.dense_value_type = routing_.dense_value_type;
  if (routing_.dense_value_type != ValueType::kFloat32) {
    dense_path_.residual.assign(dense_numel, 0.0f);
    dense_path_.next_residual.assign(dense_numel, 0.0f);
  }
  exchange_ = std::make_unique<Exchange>(comm_, std::move(exchange_layout), exchange_options);

  std::vector<int64_t> numels;
  for (const size_t t : routing_.compressed) numels.push_back(layout_[t].numel());
  if (routing_.grouped) numels.push_back(static_cast<int64_t>(dense_numel));
  if (!numels.empty()) {
    CompressionOptions compressor_options = options_.compressor;
    compressor_options.seed = rank_seed(options_.compressor.seed, comm_.rank());
    compressor_ = std::make_unique<Compressor>(numels, compressor_options);
    tensors_.selections.resize(numels.size());
    tensors_.unapplied.resize(numels.size());
    for (const int64_t n : numels) {
      tensors_.updates.emplace_back(static_cast<size_t>(n), 0.0f);
      tensors_.decay_momentum.emplace_back(static_cast<size_t>(n), 0.0f);
    }
  }
}

double DistributedStep::lr_factor_at(int64_t iteration) const {
  if (!options_.lr_in_velocity) return 1.0;
  return lr_at(options_.lr, iteration, options_.iterations_per_epoch) / options_.lr.base;
}

double DistributedStep::update_lr_at(int64_t iteration) const {
  if (options_.lr_in_velocity) return options_.lr.base;
  return lr_at(options_.lr, iteration, options_.iterations_per_epoch);
}

double DistributedStep::density() const { return density_at_iteration(iteration_); }

double DistributedStep::density_at_iteration(int64_t iteration) const {
  if (options_.compression == Compression::kNone) return 1.0;
  return density_at(options_.density, iteration, options_.iterations_per_epoch);
}

double DistributedStep::dense_path_density() const {
  if (!routing_.grouped) return 1.0;
  if (routing_.global) return density();
  DensitySchedule schedule = options_.density;
  schedule.after_warmup = options_.dense_path_density;
  return density_at(schedule, iteration_, options_.iterations_per_epoch);
}

int64_t DistributedStep::warmup_iterations() const {
  if (options_.compression == Compression::kNone) return 0;
  return static_cast<int64_t>(std::ceil(options_.density.warmup_epochs *
                                        static_cast<double>(options_.iterations_per_epoch)));
}

void DistributedStep::check_sizes(std::span<const std::span<float>> grads,
                                  std::span<const size_t> weights,
                                  std::span<const size_t> directions) const {
  const auto& layout = layout_;
  DGC_CHECK_EQ(grads.size(), layout.size(), "gradients (one per tensor of the layout)");
  DGC_CHECK_EQ(weights.size(), layout.size(), "weights (one per tensor of the layout)");
  DGC_CHECK(directions.empty() || directions.size() == layout.size(),
            "directions: one per tensor of the layout (", layout.size(), "), got ",
            directions.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto n = static_cast<size_t>(layout[t].numel());
    const size_t direction = directions.empty() ? n : directions[t];
    DGC_CHECK(grads[t].size() == n && weights[t] == n && direction == n, "tensor '", layout[t].name,
              "' has ", n, " elements but its gradient, weight and ", "direction have ",
              grads[t].size(), ", ", weights[t], " and ", direction);
  }
}

void DistributedStep::finish_step() {
  const ExchangeBytes& last = exchange_->last();
  counters_.total += last;
  if (iteration_ >= warmup_iterations()) counters_.post_warmup += last;
  ++iteration_;
  counters_.timings.update = seconds_between(exchange_end_, Clock::now());
}

bool DistributedStep::exchange_phases(std::span<const std::span<float>> grads,
                                      Clock::time_point start) {
  const int world = comm_.size();
  const bool dgc = options_.compression == Compression::kDgc;

  // 1. Local gradients, checked before anything is changed. The squared norm only where it is
  // needed before the compressor runs (local clipping, or the schedule's factor applied in
  // place); otherwise a non-finite gradient shows in the copy into the dense buffer (dense-path
  // tensors) or in the compressor's own pass (compressed tensors; its staged state is then
  // discarded, as after an overflow of the velocity).
  const double lr_factor = lr_factor_at(iteration_);
  const bool clip = dgc && options_.clip_norm > 0;
  bool local_ok = true;
  double total_squared = 0.0;
  if (clip || lr_factor != 1.0) {
    for (const auto& g : grads) total_squared += squared_norm(g);
    local_ok = std::isfinite(total_squared);
  }

  // 2. Local clipping (DGC) and, with options.lr_in_velocity, the schedule's factor of this step,
  // in one pass; the dense buffer, compression.
  double factor = lr_factor;
  if (local_ok && clip) {
    const double c = clip_coefficient(
        total_squared, local_clip_limit(options_.clip_norm, world, options_.clip_scaling));
    if (c < 1.0) factor *= c;
  }
  if (local_ok && factor != 1.0) {
    for (const auto& g : grads) scale(g, static_cast<float>(factor));
  }
  for (size_t j = 0; j < routing_.dense.size() && local_ok; ++j) {
    const auto g = grads[routing_.dense[j]];
    local_ok =
        kernels::copy_finite(g.data(), dense_path_.flat.data() + dense_path_.offsets[j], g.size());
  }
  if (!local_ok) std::fill(dense_path_.flat.begin(), dense_path_.flat.end(), 0.0f);
  // The compressor's step is staged: the committed u, v and RNG stay as they are until the
  // exchange has told every rank that every gradient was finite (no copy of the state).
  if (compressor_) {
    compressor_->discard();  // a step interrupted by an exception left its staged state
    if (local_ok) {
      try {
        const double d = density();
        for (size_t i = 0; i < routing_.compressed.size(); ++i) {
          compressor_->stage(i, grads[routing_.compressed[i]], d, tensors_.selections[i]);
        }
        if (routing_.grouped) {
          compressor_->stage(group(), dense_path_.flat, dense_path_density(),
                             tensors_.selections[group()]);
        }
      } catch (const NumericError&) {
        // A non-finite gradient, or the velocity overflowed: report it like a bad gradient so
        // every rank stops together.
        local_ok = false;
      }
    }
    if (!local_ok) {
      for (auto& selection : tensors_.selections) selection.clear();
    }
  }
  if (!dense_path_.residual.empty() && local_ok) {
    round_with_residual(dense_path_.flat, dense_path_.residual, dense_path_.next_residual,
                        routing_.dense_value_type);
  }

  if (on_selected_) on_selected_();

  // 3. The exchange.
  std::vector<std::span<float>> update_spans;
  for (auto& u : tensors_.updates) update_spans.emplace_back(u);
  const auto exchange_start = Clock::now();
  const std::span<float> dense_exchanged =
      routing_.grouped ? std::span<float>() : std::span<float>(dense_path_.flat);
  const int bad_ranks = exchange_->run(static_cast<uint64_t>(iteration_), tensors_.selections,
                                       update_spans, dense_exchanged, local_ok, tensors_.unapplied);
  exchange_end_ = Clock::now();
  counters_.timings.compress = seconds_between(start, exchange_start);
  counters_.timings.exchange = seconds_between(exchange_start, exchange_end_);

  // 4. A bad gradient anywhere: nothing of the step is kept, on every rank.
  skips_.last_bad_ranks = bad_ranks;
  if (bad_ranks > 0) {
    if (compressor_) compressor_->discard();
    check_nonfinite_step(
        options_, bad_ranks, world, iteration_, local_ok, skips_.consecutive,
        "--max-consecutive-skips",
        "Lower the learning rate (--lr), enable gradient clipping (--clip-norm) or a longer "
        "warm-up (--lr-warmup-epochs), and restart from the last checkpoint (--resume)");
    ++skips_.consecutive;
    ++skips_.total;
    return false;
  }
  skips_.consecutive = 0;
  if (compressor_) compressor_->commit();
  if (!dense_path_.residual.empty()) dense_path_.residual.swap(dense_path_.next_residual);

  // What this rank selected but the exchange did not apply stays in its residual.
  for (size_t i = 0; i < tensors_.unapplied.size(); ++i) {
    if (!tensors_.unapplied[i].indices.empty())
      compressor_->return_to_velocity(i, tensors_.unapplied[i]);
  }

  // Dense baseline: clip the averaged gradient as dense training would.
  if (!dgc && options_.clip_norm > 0) {
    const double c = clip_coefficient(squared_norm(dense_path_.flat), options_.clip_norm);
    if (c < 1.0) scale(dense_path_.flat, static_cast<float>(c));
  }
  return true;
}

std::vector<NamedBuffer<const float>> DistributedStep::state_buffers() const {
  std::vector<NamedBuffer<const float>> buffers;
  // The mutable overload only hands out spans; these are read-only views of the same buffers.
  for (auto& b : const_cast<DistributedStep*>(this)->state_buffers()) {
    buffers.push_back({std::move(b.name), b.values});
  }
  return buffers;
}

std::vector<NamedBuffer<float>> DistributedStep::state_buffers() {
  std::vector<NamedBuffer<float>> buffers;
  for (size_t j = 0; j < dense_path_.momentum.size(); ++j) {
    buffers.push_back(
        {"optimizer/momentum/" + layout_[routing_.dense[j]].name, dense_path_.momentum[j]});
  }
  for (size_t i = 0; i < tensors_.selections.size(); ++i) {
    const std::string name =
        i < routing_.compressed.size() ? layout_[routing_.compressed[i]].name : kDensePathGroup;
    buffers.push_back({"optimizer/decay_momentum/" + name, tensors_.decay_momentum[i]});
    buffers.push_back({"dgc/momentum/" + name, compressor_->momentum(i)});
    buffers.push_back({"dgc/velocity/" + name, compressor_->velocity(i)});
  }
  if (!dense_path_.residual.empty())
    buffers.push_back({"optimizer/dense_residual", dense_path_.residual});
  return buffers;
}

void DistributedStep::for_each_selected(const std::function<void(size_t, size_t, float)>& f) const {
  for (size_t i = 0; i < tensors_.selections.size(); ++i) {
    const Selection& selection = tensors_.selections[i];
    for (size_t j = 0; j < selection.indices.size(); ++j) {
      const size_t e = selection.indices[j];
      if (i < routing_.compressed.size()) {
        f(routing_.compressed[i], e, selection.values[j]);
        continue;
      }
      // The dense-path group: the flat index's tensor, by the offsets of the dense tensors.
      const auto& offsets = dense_path_.offsets;
      const size_t d = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), e) -
                                           offsets.begin() - 1);
      f(routing_.dense[d], e - offsets[d], selection.values[j]);
    }
  }
}

std::string DistributedStep::rng_state() const {
  if (!compressor_) return "";
  std::ostringstream out;
  out << compressor_->rng();
  return out.str();
}

void DistributedStep::set_rng_state(const std::string& text) {
  if (!compressor_) return;
  std::istringstream in(text);
  std::mt19937_64 rng;
  in >> rng;
  if (!in) throw InvalidArgument("the compressor's RNG state is malformed");
  compressor_->rng() = rng;
}

}  // namespace dgc::train
