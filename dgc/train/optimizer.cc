#include "dgc/train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include <torch/torch.h>

#include "dgc/core/clip.h"
#include "dgc/core/error.h"
#include "dgc/core/schedule.h"

namespace dgc::train {
namespace {

std::span<float> float_span(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

std::string bytes_text(const ExchangeBytes& b) {
  std::ostringstream out;
  out << b.message << " " << b.dense_gradient << " " << b.wire_sent << " " << b.wire_received << " "
      << b.dense_wire_sent << " " << b.message_compressed << " " << b.message_dense_path << " "
      << b.message_headers;
  return out.str();
}

ExchangeBytes parse_bytes(const CheckpointFile& file, const std::string& name) {
  std::istringstream in(file.text(name));
  ExchangeBytes b;
  if (!(in >> b.message >> b.dense_gradient >> b.wire_sent >> b.wire_received >>
        b.dense_wire_sent >> b.message_compressed >> b.message_dense_path >> b.message_headers)) {
    throw DataError("checkpoint " + file.path() + ": record '" + name + "' is malformed");
  }
  return b;
}

int64_t parse_int(const CheckpointFile& file, const std::string& name) {
  const std::string text = file.text(name);
  try {
    size_t used = 0;
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw DataError("checkpoint " + file.path() + ": record '" + name + "' is not an integer: '" +
                  text + "'");
}

// The dense-path group's name in the exchange's layout and in checkpoints.
constexpr const char* kDensePathGroup = "[dense-path group]";

// The update of a compressed tensor (and of a dense-path tensor with kGrouped): weight decay
// through its own momentum b, then the received update, which already holds the momentum.
void apply_update(float* w, const float* update, float* b, size_t n, float lr, float m, float wd,
                  bool nesterov) {
  if (wd == 0.0f) {
    for (size_t e = 0; e < n; ++e) w[e] -= lr * update[e];
    return;
  }
  for (size_t e = 0; e < n; ++e) {
    const float decay = wd * w[e];
    b[e] = m * b[e] + decay;
    w[e] -= lr * ((nesterov ? decay + m * b[e] : b[e]) + update[e]);
  }
}

// A distinct sampling stream per rank from the shared seed.
uint64_t rank_seed(uint64_t seed, int rank) {
  return seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1));
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(comm::Communicator& comm, torch::nn::Module& model,
                                           OptimizerOptions options,
                                           const std::string& run_settings)
    : comm_(comm), model_(model), options_(std::move(options)) {
  DGC_CHECK_GE(options_.iterations_per_epoch, 1, "iterations per epoch");
  DGC_CHECK(options_.density.density > 0 && options_.density.density <= 1,
            "density must be in (0, 1], got ", options_.density.density);
  DGC_CHECK(options_.dense_path_density > 0 && options_.dense_path_density <= 1,
            "dense-path density must be in (0, 1], got ", options_.dense_path_density);
  DGC_CHECK_GE(options_.weight_decay, 0.0, "weight decay");
  DGC_CHECK_GE(options_.compressor.momentum.momentum, 0.0, "momentum");

  std::vector<std::pair<std::string, std::vector<int64_t>>> named_shapes;
  for (const auto& item : model_.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    DGC_CHECK(p.scalar_type() == torch::kFloat32 && p.device().is_cpu() && p.is_contiguous(),
              "parameter '", item.key(), "' must be a contiguous float32 CPU tensor");
    params_.push_back({item.key(), p});
    named_shapes.emplace_back(item.key(), p.sizes().vec());
  }
  DGC_CHECK(!params_.empty(), "the model has no parameters");

  const bool dgc = options_.compression == Compression::kDgc;
  layout_ = make_layout(named_shapes, options_.policy);
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (!dgc) layout_[t].path = TensorPath::kDense;
    (layout_[t].path == TensorPath::kCompressed ? compressed_ : dense_).push_back(t);
  }
  grouped_ = dgc && options_.dense_path == DensePath::kGrouped && !dense_.empty();
  size_t dense_numel = 0;
  for (const size_t t : dense_) {
    const auto n = static_cast<size_t>(layout_[t].numel());
    dense_offsets_.push_back(dense_numel);
    if (!grouped_) dense_momentum_.emplace_back(n, 0.0f);
    dense_numel += n;
  }
  dense_flat_.assign(dense_numel, 0.0f);
  settings_ = describe(options_) + run_settings;
  if (!settings_.empty() && settings_.back() != '\n') settings_ += '\n';

  ExchangeOptions exchange_options;
  exchange_options.value_type = options_.compressor.value_type;
  exchange_options.timeout = options_.timeout;
  exchange_options.settings = settings_;
  exchange_options.algorithm = options_.exchange;
  exchange_options.density = options_.density.density;
  std::vector<TensorSpec> exchange_layout;
  if (grouped_) {
    // The compressed tensors, then the dense-path group in their place.
    for (const size_t t : compressed_) exchange_layout.push_back(layout_[t]);
    exchange_layout.push_back(
        TensorSpec{kDensePathGroup, {static_cast<int64_t>(dense_numel)}, TensorPath::kCompressed});
    exchange_options.dense_path_group = compressed_.size();
  } else {
    exchange_layout = layout_;
  }
  if (dgc && options_.dense_path == DensePath::kFloat16) {
    dense_value_type_ = ValueType::kFloat16;
  } else if (dgc && options_.dense_path == DensePath::kBFloat16) {
    dense_value_type_ = ValueType::kBFloat16;
  }
  exchange_options.dense_value_type = dense_value_type_;
  if (dense_value_type_ != ValueType::kFloat32) {
    dense_residual_.assign(dense_numel, 0.0f);
    saved_residual_.assign(dense_numel, 0.0f);
  }
  exchange_ = std::make_unique<Exchange>(comm_, std::move(exchange_layout), exchange_options);

  std::vector<int64_t> numels;
  for (const size_t t : compressed_) numels.push_back(layout_[t].numel());
  if (grouped_) numels.push_back(static_cast<int64_t>(dense_numel));
  if (!numels.empty()) {
    CompressionOptions compressor_options = options_.compressor;
    compressor_options.density = options_.density.density;
    compressor_options.seed = rank_seed(options_.compressor.seed, comm_.rank());
    compressor_ = std::make_unique<Compressor>(numels, compressor_options);
    selections_.resize(numels.size());
    unapplied_.resize(numels.size());
    for (const int64_t n : numels) {
      updates_.emplace_back(static_cast<size_t>(n), 0.0f);
      decay_momentum_.emplace_back(static_cast<size_t>(n), 0.0f);
      saved_momentum_.emplace_back(static_cast<size_t>(n), 0.0f);
      saved_velocity_.emplace_back(static_cast<size_t>(n), 0.0f);
    }
  }

  // The initial broadcast: every rank starts from rank 0's model.
  std::vector<std::span<float>> spans;
  for (auto& p : params_) spans.push_back(float_span(p.tensor));
  broadcast_parameters(comm_, spans, options_.timeout);
  synchronize_buffers();
}

double DistributedOptimizer::learning_rate() const {
  return lr_at(options_.lr, iteration_, options_.iterations_per_epoch);
}

double DistributedOptimizer::density() const {
  if (options_.compression == Compression::kNone) return 1.0;
  return density_at(options_.density, iteration_, options_.iterations_per_epoch);
}

double DistributedOptimizer::dense_path_density() const {
  if (!grouped_) return 1.0;
  DensitySchedule schedule = options_.density;
  schedule.density = options_.dense_path_density;
  return density_at(schedule, iteration_, options_.iterations_per_epoch);
}

int64_t DistributedOptimizer::warmup_iterations() const {
  if (options_.compression == Compression::kNone) return 0;
  return static_cast<int64_t>(std::ceil(options_.density.warmup_epochs *
                                        static_cast<double>(options_.iterations_per_epoch)));
}

void DistributedOptimizer::restore_compressor() {
  for (size_t i = 0; i < saved_momentum_.size(); ++i) {
    std::copy(saved_momentum_[i].begin(), saved_momentum_[i].end(),
              compressor_->momentum(i).begin());
    std::copy(saved_velocity_[i].begin(), saved_velocity_[i].end(),
              compressor_->velocity(i).begin());
  }
  compressor_->rng() = saved_rng_;
}

void DistributedOptimizer::step() {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  };
  const auto start = Clock::now();
  const int world = comm_.size();
  const bool dgc = options_.compression == Compression::kDgc;

  // 1. Local gradients, checked before anything is changed.
  std::vector<torch::Tensor> grads(params_.size());
  double total_squared = 0.0;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor g = params_[i].tensor.grad();
    if (!g.defined()) {
      g = torch::zeros_like(params_[i].tensor);
    } else {
      DGC_CHECK(g.scalar_type() == torch::kFloat32 && g.device().is_cpu(), "gradient of '",
                params_[i].name, "' must be float32 on the CPU");
      g = g.contiguous();
    }
    grads[i] = g;
    total_squared += squared_norm(float_span(g));
  }
  bool local_ok = std::isfinite(total_squared);

  // 2. Local clipping (DGC), compression, and the dense buffer.
  if (local_ok && dgc && options_.clip_norm > 0) {
    const double c = clip_coefficient(
        total_squared, local_clip_limit(options_.clip_norm, world, options_.clip_scaling));
    if (c < 1.0) {
      for (auto& g : grads) scale(float_span(g), static_cast<float>(c));
    }
  }
  for (size_t j = 0; j < dense_.size(); ++j) {
    const auto g = float_span(grads[dense_[j]]);
    const auto to = dense_flat_.begin() + static_cast<ptrdiff_t>(dense_offsets_[j]);
    if (local_ok) {
      std::copy(g.begin(), g.end(), to);
    } else {
      std::fill_n(to, g.size(), 0.0f);
    }
  }
  if (compressor_) {
    for (size_t i = 0; i < selections_.size(); ++i) {
      const auto m = compressor_->momentum(i);
      const auto v = compressor_->velocity(i);
      std::copy(m.begin(), m.end(), saved_momentum_[i].begin());
      std::copy(v.begin(), v.end(), saved_velocity_[i].begin());
    }
    saved_rng_ = compressor_->rng();
    if (local_ok) {
      try {
        const double d = density();
        for (size_t i = 0; i < compressed_.size(); ++i) {
          compressor_->step(i, float_span(grads[compressed_[i]]), d, selections_[i]);
        }
        if (grouped_) {
          compressor_->step(group(), dense_flat_, dense_path_density(), selections_[group()]);
        }
      } catch (const NumericError&) {
        // The velocity overflowed: report it like a bad gradient so every rank stops together.
        local_ok = false;
      }
    }
    if (!local_ok) {
      for (auto& selection : selections_) selection.clear();
    }
  }
  if (!dense_residual_.empty()) {
    saved_residual_ = dense_residual_;
    if (local_ok) round_with_residual(dense_flat_, dense_residual_, dense_value_type_);
  }

  // 3. The exchange.
  std::vector<std::span<float>> update_spans;
  for (auto& u : updates_) update_spans.emplace_back(u);
  const auto exchange_start = Clock::now();
  const std::span<float> dense_exchanged =
      grouped_ ? std::span<float>() : std::span<float>(dense_flat_);
  const int bad_ranks = exchange_->run(static_cast<uint64_t>(iteration_), selections_, update_spans,
                                       dense_exchanged, local_ok, unapplied_);
  const auto exchange_end = Clock::now();
  timings_.compress = seconds(start, exchange_start);
  timings_.exchange = seconds(exchange_start, exchange_end);

  // 4. A bad gradient anywhere: undo, and every rank stops at this step.
  if (bad_ranks > 0) {
    if (compressor_) restore_compressor();
    dense_residual_ = saved_residual_;
    throw NumericError(detail::concat(
        "non-finite gradient (NaN or Inf) on ", bad_ranks, " of ", world, " rank(s) at iteration ",
        iteration_, " (epoch ", iteration_ / options_.iterations_per_epoch + 1,
        "); this rank's gradient was ", local_ok ? "finite" : "not finite",
        ". Nothing was applied. Lower the learning rate (--lr), enable gradient clipping "
        "(--clip-norm) or a longer warm-up (--lr-warmup-epochs), and restart from the last "
        "checkpoint (--resume)"));
  }

  // What this rank selected but the exchange did not apply stays in its residual.
  for (size_t i = 0; i < unapplied_.size(); ++i) {
    if (!unapplied_[i].indices.empty()) compressor_->return_to_velocity(i, unapplied_[i]);
  }

  // Dense baseline: clip the averaged gradient as dense training would.
  if (!dgc && options_.clip_norm > 0) {
    const double c = clip_coefficient(squared_norm(dense_flat_), options_.clip_norm);
    if (c < 1.0) scale(dense_flat_, static_cast<float>(c));
  }

  // 5. The update.
  torch::NoGradGuard no_grad;
  const auto lr = static_cast<float>(learning_rate());
  const auto m = static_cast<float>(options_.compressor.momentum.momentum);
  const bool nesterov = options_.compressor.momentum.nesterov;
  const auto wd = static_cast<float>(options_.weight_decay);
  if (!grouped_) {
    for (size_t j = 0; j < dense_.size(); ++j) {
      float* w = params_[dense_[j]].tensor.data_ptr<float>();
      const float* avg = dense_flat_.data() + dense_offsets_[j];
      float* u = dense_momentum_[j].data();
      const size_t n = dense_momentum_[j].size();
      for (size_t e = 0; e < n; ++e) {
        const float g = avg[e] + wd * w[e];
        u[e] = m * u[e] + g;
        w[e] -= lr * (nesterov ? g + m * u[e] : u[e]);
      }
    }
  }
  for (size_t i = 0; i < compressed_.size(); ++i) {
    apply_update(params_[compressed_[i]].tensor.data_ptr<float>(), updates_[i].data(),
                 decay_momentum_[i].data(), updates_[i].size(), lr, m, wd, nesterov);
  }
  if (grouped_) {
    for (size_t j = 0; j < dense_.size(); ++j) {
      const size_t at = dense_offsets_[j];
      apply_update(params_[dense_[j]].tensor.data_ptr<float>(), updates_[group()].data() + at,
                   decay_momentum_[group()].data() + at,
                   static_cast<size_t>(params_[dense_[j]].tensor.numel()), lr, m, wd, nesterov);
    }
  }

  const ExchangeBytes& last = exchange_->last();
  total_ += last;
  if (iteration_ >= warmup_iterations()) post_warmup_ += last;
  ++iteration_;
  timings_.update = seconds(exchange_end, Clock::now());
}

void DistributedOptimizer::synchronize_buffers() {
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
  comm_.broadcast(packed, 0, options_.timeout);
  offset = 0;
  for (auto& b : buffers) {
    std::memcpy(b.data_ptr(), packed.data() + offset, b.nbytes());
    offset += b.nbytes();
  }
}

void DistributedOptimizer::check_agreement() {
  uint8_t mine[8];
  for (int i = 0; i < 8; ++i)
    mine[i] = static_cast<uint8_t>(static_cast<uint64_t>(iteration_) >> (8 * i));
  const auto all = comm_.allgatherv(mine, options_.timeout);
  for (size_t r = 0; r < all.size(); ++r) {
    DGC_CHECK_EQ(all[r].size(), 8u, "iteration message from rank ", r);
    uint64_t theirs = 0;
    for (int i = 0; i < 8; ++i) theirs |= uint64_t{all[r][i]} << (8 * i);
    if (theirs != static_cast<uint64_t>(iteration_)) {
      throw MismatchError(
          detail::concat("rank ", r, " is at iteration ", theirs, " but rank ", comm_.rank(),
                         " is at ", iteration_,
                         ": the per-rank checkpoint files come from different steps (a run stopped "
                         "while writing them?); start a new run without --resume"));
    }
  }
}

void DistributedOptimizer::save(CheckpointFile& file) const {
  file.put_text("optimizer/settings", settings_);
  file.put_text("optimizer/world_size", std::to_string(comm_.size()));
  file.put_text("optimizer/rank", std::to_string(comm_.rank()));
  file.put_text("optimizer/iteration", std::to_string(iteration_));
  file.put_text("optimizer/bytes_total", bytes_text(total_));
  file.put_text("optimizer/bytes_post_warmup", bytes_text(post_warmup_));
  for (const auto& p : params_) {
    file.put_array("model/param/" + p.name, "float32", p.tensor.sizes().vec(), p.tensor.data_ptr(),
                   p.tensor.nbytes());
  }
  for (const auto& item : model_.named_buffers(/*recurse=*/true)) {
    const auto& b = item.value();
    file.put_array("model/buffer/" + item.key(), c10::toString(b.scalar_type()), b.sizes().vec(),
                   b.data_ptr(), b.nbytes());
  }
  for (size_t j = 0; j < dense_momentum_.size(); ++j) {
    file.put_floats("optimizer/momentum/" + layout_[dense_[j]].name, dense_momentum_[j]);
  }
  for (size_t i = 0; i < selections_.size(); ++i) {
    const std::string name =
        i < compressed_.size() ? layout_[compressed_[i]].name : kDensePathGroup;
    file.put_floats("optimizer/decay_momentum/" + name, decay_momentum_[i]);
    file.put_floats("dgc/momentum/" + name, compressor_->momentum(i));
    file.put_floats("dgc/velocity/" + name, compressor_->velocity(i));
  }
  if (!dense_residual_.empty()) file.put_floats("optimizer/dense_residual", dense_residual_);
  if (compressor_) {
    std::ostringstream rng;
    rng << compressor_->rng();
    file.put_text("dgc/rng", rng.str());
  }
}

void DistributedOptimizer::load(const CheckpointFile& file) {
  const std::string& path = file.path();
  const int64_t world = parse_int(file, "optimizer/world_size");
  if (world != comm_.size()) {
    throw DataError(detail::concat("checkpoint ", path, " was written by a run with ", world,
                                   " workers, this run has ", comm_.size(),
                                   ": resume with the same number of workers"));
  }
  const int64_t rank = parse_int(file, "optimizer/rank");
  if (rank != comm_.rank()) {
    throw DataError(detail::concat("checkpoint ", path, " belongs to rank ", rank, ", not to rank ",
                                   comm_.rank()));
  }
  const std::string stored = file.text("optimizer/settings");
  if (stored != settings_) {
    std::string difference = describe_settings_difference(stored, settings_);
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
  for (size_t j = 0; j < dense_momentum_.size(); ++j) {
    file.get_floats("optimizer/momentum/" + layout_[dense_[j]].name, dense_momentum_[j]);
  }
  for (size_t i = 0; i < selections_.size(); ++i) {
    const std::string name =
        i < compressed_.size() ? layout_[compressed_[i]].name : kDensePathGroup;
    file.get_floats("optimizer/decay_momentum/" + name, decay_momentum_[i]);
    file.get_floats("dgc/momentum/" + name, compressor_->momentum(i));
    file.get_floats("dgc/velocity/" + name, compressor_->velocity(i));
  }
  if (!dense_residual_.empty()) file.get_floats("optimizer/dense_residual", dense_residual_);
  if (compressor_) {
    std::istringstream rng(file.text("dgc/rng"));
    rng >> compressor_->rng();
    if (!rng) throw DataError("checkpoint " + path + ": record 'dgc/rng' is malformed");
  }
  iteration_ = parse_int(file, "optimizer/iteration");
  total_ = parse_bytes(file, "optimizer/bytes_total");
  post_warmup_ = parse_bytes(file, "optimizer/bytes_post_warmup");
}

}  // namespace dgc::train
