#include "python/device_step.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include "dgc/core/clip.h"
#include "dgc/core/error.h"
#include "dgc/core/schedule.h"
#include "dgc/train/step.h"

namespace dgc::python {
namespace {

using train::Compression;
using train::DensePath;
using train::NonFinitePolicy;
using train::SelectionScope;

// DistributedStep's names and seeds (dgc/train/step.cc), so that a device rank draws and saves
// exactly as a rank on the core path.
constexpr const char* kDensePathGroup = "[dense-path group]";
uint64_t rank_seed(uint64_t seed, int rank) {
  return seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1));
}

void refuse_unsupported(const train::OptimizerOptions& o) {
  const char* remedy =
      " is not supported with gradients on the device (the device compressor); "
      "use the core path (compressor=\"core\"), which copies them to the host";
  DGC_CHECK(o.compression == Compression::kDgc, "compression=\"none\"", remedy);
  DGC_CHECK(o.selection_scope == SelectionScope::kTensor, "selection_scope=\"global\"", remedy);
  DGC_CHECK(o.dense_path == DensePath::kExact || o.dense_path == DensePath::kGrouped,
            "dense_path=\"", train::to_string(o.dense_path), "\"", remedy);
  DGC_CHECK(o.exchange != ExchangeAlgorithm::kSparseAllreduce, "exchange=\"sparse-allreduce\"",
            remedy);
  DGC_CHECK(!o.lr_in_velocity, "the learning rate inside the velocity", remedy);
}

torch::Tensor checked(const torch::Tensor& t, const TensorSpec& spec, torch::Device device,
                      const char* what) {
  DGC_CHECK(t.defined(), "the ", what, " of '", spec.name, "' is undefined");
  DGC_CHECK_EQ(t.numel(), spec.numel(), "elements of the ", what, " of '", spec.name, "'");
  DGC_CHECK(t.scalar_type() == torch::kFloat32, "the ", what, " of '", spec.name,
            "' must be float32 for the device compressor, got ", c10::toString(t.scalar_type()));
  DGC_CHECK(t.device() == device, "the ", what, " of '", spec.name, "' is on ", t.device().str(),
            " but the hook's state is on ", device.str(), ": keep the whole model on one device");
  return t.detach().reshape({-1});
}

// A host buffer's values at `positions`, on the device, scattered into zeros of n elements.
torch::Tensor scattered(const std::vector<float>& host, std::span<const uint64_t> positions,
                        int64_t n, torch::Device device) {
  const auto count = static_cast<int64_t>(positions.size());
  torch::Tensor index = torch::empty({count}, torch::kInt64);
  torch::Tensor value = torch::empty({count}, torch::kFloat32);
  int64_t* ip = index.data_ptr<int64_t>();
  float* vp = value.data_ptr<float>();
  for (int64_t j = 0; j < count; ++j) {
    ip[j] = static_cast<int64_t>(positions[static_cast<size_t>(j)]);
    vp[j] = host[positions[static_cast<size_t>(j)]];
  }
  torch::Tensor out =
      torch::zeros({n}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  if (count > 0) out.index_copy_(0, index.to(device), value.to(device));
  return out;
}

// DistributedStep's compressed_direction on the device: b = m*b + wd*w;
// direction = (Nesterov ? wd*w + m*b : b) + update; wd == 0: direction = update.
torch::Tensor compressed_direction(const torch::Tensor& w, const torch::Tensor& update,
                                   torch::Tensor& b, float m, float wd, bool nesterov) {
  if (wd == 0.0f) return update;
  const torch::Tensor decay = torch::mul(w, static_cast<double>(wd));
  b.mul_(static_cast<double>(m)).add_(decay);
  const torch::Tensor d = nesterov ? torch::add(decay, torch::mul(b, static_cast<double>(m))) : b;
  return torch::add(d, update);
}

}  // namespace

DeviceStep::DeviceStep(
    comm::Communicator& comm,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& named_shapes,
    train::OptimizerOptions options, const std::string& run_settings, torch::Device device)
    : comm_(comm), options_(std::move(options)), device_(device) {
  refuse_unsupported(options_);
  DGC_CHECK_GE(options_.iterations_per_epoch, 1, "iterations per epoch");
  check_density(options_.density.after_warmup);
  check_density(options_.dense_path_density, "dense-path density");
  DGC_CHECK(options_.max_consecutive_skips >= 1, "max_consecutive_skips must be at least 1, got ",
            options_.max_consecutive_skips);
  DGC_CHECK(!named_shapes.empty(), "the model has no parameters");
  layout_ = make_layout(named_shapes, options_.policy);
  for (size_t t = 0; t < layout_.size(); ++t) {
    (layout_[t].path == TensorPath::kCompressed ? compressed_ : dense_).push_back(t);
  }
  grouped_ = options_.dense_path == DensePath::kGrouped && !dense_.empty();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  for (const size_t t : dense_) {
    dense_offsets_.push_back(dense_numel_);
    if (!grouped_) dense_momentum_.push_back(torch::zeros({layout_[t].numel()}, f32));
    dense_numel_ += layout_[t].numel();
  }
  if (!grouped_) dense_flat_.assign(static_cast<size_t>(dense_numel_), 0.0f);
  settings_ = step_settings(options_, run_settings);

  // 3. The exchange, built as DistributedStep builds it.
  ExchangeOptions exchange_options = exchange_options_of(options_, settings_);
  std::vector<TensorSpec> exchange_layout;
  if (grouped_) {
    for (const size_t t : compressed_) exchange_layout.push_back(layout_[t]);
    exchange_layout.push_back(TensorSpec{kDensePathGroup, {dense_numel_}, TensorPath::kCompressed});
    exchange_options.dense_path_group = compressed_.size();
  } else {
    exchange_layout = layout_;
  }
  exchange_ = std::make_unique<Exchange>(comm_, std::move(exchange_layout), exchange_options);
  // exchange="auto" may resolve to the sparse allreduce, whose hand-back of unapplied elements
  // the device step does not do (every rank resolves alike, so every rank throws).
  DGC_CHECK(exchange_->algorithm() != ExchangeAlgorithm::kSparseAllreduce,
            "exchange=\"auto\" chose the sparse allreduce, which the device compressor does not "
            "support: pass exchange=\"allgather\" or compressor=\"core\"");

  std::vector<int64_t> numels;
  for (const size_t t : compressed_) numels.push_back(layout_[t].numel());
  if (grouped_) numels.push_back(dense_numel_);
  CompressionOptions compressor_options = options_.compressor;
  compressor_options.seed = rank_seed(options_.compressor.seed, comm_.rank());
  compressor_ = std::make_unique<DeviceCompressor>(numels, compressor_options, device_);
  selections_.resize(numels.size());
  for (const int64_t n : numels) {
    host_updates_.emplace_back(static_cast<size_t>(n), 0.0f);
    decay_momentum_.push_back(torch::zeros({n}, f32));
  }
}

double DeviceStep::density() const {
  return density_at(options_.density, iteration_, options_.iterations_per_epoch);
}

double DeviceStep::dense_path_density() const {
  if (!grouped_) return 1.0;
  DensitySchedule schedule = options_.density;
  schedule.after_warmup = options_.dense_path_density;
  return density_at(schedule, iteration_, options_.iterations_per_epoch);
}

int64_t DeviceStep::warmup_iterations() const {
  return static_cast<int64_t>(std::ceil(options_.density.warmup_epochs *
                                        static_cast<double>(options_.iterations_per_epoch)));
}

bool DeviceStep::run(const std::vector<torch::Tensor>& grads,
                     const std::vector<torch::Tensor>& weights) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  };
  const auto start = Clock::now();
  torch::NoGradGuard no_grad;
  DGC_CHECK_EQ(grads.size(), layout_.size(), "gradient tensors (one per parameter)");
  DGC_CHECK_EQ(weights.size(), layout_.size(), "weight tensors (one per parameter)");
  std::vector<torch::Tensor> g, w;
  for (size_t t = 0; t < layout_.size(); ++t) {
    g.push_back(checked(grads[t], layout_[t], device_, "gradient"));
    w.push_back(checked(weights[t], layout_[t], device_, "weight"));
  }
  const int world = comm_.size();

  // 1. The local gradient, checked before anything changes (one synchronisation).
  torch::Tensor finite =
      torch::ones({}, torch::TensorOptions().dtype(torch::kBool).device(device_));
  for (const auto& x : g) finite = finite & torch::isfinite(x).all();
  bool local_ok = finite.item<bool>();

  // 2. Clipping, the dense-path tensors, the staged compressor steps.
  std::vector<torch::Tensor> work = g;  // scaled copies when clipping; the inputs otherwise
  if (local_ok && options_.clip_norm > 0) {
    torch::Tensor total =
        torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
    for (const auto& x : g) total += x.to(torch::kFloat64).square().sum();
    const double c = clip_coefficient(
        total.item<double>(), local_clip_limit(options_.clip_norm, world, options_.clip_scaling));
    if (c < 1.0) {
      for (auto& x : work) x = torch::mul(x, static_cast<double>(static_cast<float>(c)));
    }
  }
  torch::Tensor dense_device;  // the dense-path tensors concatenated (grouped)
  if (!dense_.empty() && local_ok) {
    std::vector<torch::Tensor> parts;
    for (const size_t t : dense_) parts.push_back(work[t]);
    dense_device = torch::cat(parts);
  }
  if (!grouped_) {
    if (local_ok && dense_numel_ > 0) {
      const torch::Tensor host = dense_device.to(torch::kCPU).contiguous();
      std::copy_n(host.data_ptr<float>(), dense_flat_.size(), dense_flat_.begin());
    } else {
      std::fill(dense_flat_.begin(), dense_flat_.end(), 0.0f);
    }
  }
  compressor_->discard();
  std::vector<DeviceSelection> device_selections(selections_.size());
  if (local_ok) {
    try {
      const double d = density();
      for (size_t i = 0; i < compressed_.size(); ++i) {
        compressor_->stage(i, work[compressed_[i]], d, device_selections[i]);
      }
      if (grouped_)
        compressor_->stage(group(), dense_device, dense_path_density(), device_selections[group()]);
      // Only the selections come to the host.
      for (size_t i = 0; i < selections_.size(); ++i)
        selections_[i] = device_selections[i].to_host();
    } catch (const NumericError&) {
      local_ok = false;  // the velocity overflowed: every rank learns it from the exchange
    }
  }
  if (!local_ok) {
    for (auto& selection : selections_) selection.clear();
  }

  // 3. The exchange.
  std::vector<std::span<float>> update_spans;
  for (auto& u : host_updates_) update_spans.emplace_back(u);
  const auto exchange_start = Clock::now();
  const std::span<float> dense_exchanged =
      grouped_ ? std::span<float>() : std::span<float>(dense_flat_);
  const int bad_ranks = exchange_->run(static_cast<uint64_t>(iteration_), selections_, update_spans,
                                       dense_exchanged, local_ok);
  const auto exchange_end = Clock::now();
  timings_[0] = seconds(start, exchange_start);
  timings_[1] = seconds(exchange_start, exchange_end);

  // 4. A bad gradient anywhere: nothing of the step is kept, on every rank.
  skips_.last_bad_ranks = bad_ranks;
  if (bad_ranks > 0) {
    compressor_->discard();
    check_nonfinite_step(
        options_, bad_ranks, world, iteration_, local_ok, skips_.consecutive,
        "max_consecutive_skips",
        "Lower the learning rate, enable gradient clipping (clip_norm) or a longer "
        "warm-up, and restart from the last checkpoint");
    ++skips_.consecutive;
    ++skips_.total;
    for (const auto& x : grads) x.detach().zero_();
    total_ += exchange_->last();
    if (iteration_ >= warmup_iterations()) post_warmup_ += exchange_->last();
    ++iteration_;
    timings_[2] = seconds(exchange_end, Clock::now());
    return false;
  }
  skips_.consecutive = 0;
  compressor_->commit();

  // 5. The directions, on the device.
  const auto m = static_cast<float>(options_.compressor.momentum.factor);
  const bool nesterov = options_.compressor.momentum.nesterov;
  const auto wd = static_cast<float>(options_.weight_decay);
  std::vector<torch::Tensor> directions(layout_.size());
  for (size_t i = 0; i < selections_.size(); ++i) {
    const auto n = static_cast<int64_t>(host_updates_[i].size());
    const torch::Tensor update =
        scattered(host_updates_[i], exchange_->last_written(i), n, device_);
    if (i < compressed_.size()) {
      directions[compressed_[i]] =
          compressed_direction(w[compressed_[i]], update, decay_momentum_[i], m, wd, nesterov);
      continue;
    }
    for (size_t j = 0; j < dense_.size(); ++j) {  // the dense-path group's slices
      const int64_t at = dense_offsets_[j];
      const int64_t size = layout_[dense_[j]].numel();
      torch::Tensor b = decay_momentum_[i].narrow(0, at, size);
      directions[dense_[j]] =
          compressed_direction(w[dense_[j]], update.narrow(0, at, size), b, m, wd, nesterov);
    }
  }
  if (!grouped_ && dense_numel_ > 0) {
    const torch::Tensor averaged =
        torch::from_blob(dense_flat_.data(), {dense_numel_}, torch::kFloat32).to(device_);
    for (size_t j = 0; j < dense_.size(); ++j) {
      const int64_t size = layout_[dense_[j]].numel();
      const torch::Tensor avg = averaged.narrow(0, dense_offsets_[j], size);
      // g = avg + wd*w; u = m*u + g; direction = Nesterov ? g + m*u : u.
      const torch::Tensor gj = torch::add(avg, torch::mul(w[dense_[j]], static_cast<double>(wd)));
      torch::Tensor& u = dense_momentum_[j];
      u.mul_(static_cast<double>(m)).add_(gj);
      directions[dense_[j]] = nesterov ? torch::add(gj, torch::mul(u, static_cast<double>(m))) : u;
    }
  }
  for (size_t t = 0; t < layout_.size(); ++t) {
    grads[t].detach().copy_(directions[t].view_as(grads[t]));
  }

  total_ += exchange_->last();
  if (iteration_ >= warmup_iterations()) post_warmup_ += exchange_->last();
  ++iteration_;
  timings_[2] = seconds(exchange_end, Clock::now());
  return true;
}

std::vector<std::pair<std::string, torch::Tensor>> DeviceStep::state_buffers() {
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  for (size_t j = 0; j < dense_momentum_.size(); ++j) {
    buffers.emplace_back("optimizer/momentum/" + layout_[dense_[j]].name, dense_momentum_[j]);
  }
  for (size_t i = 0; i < selections_.size(); ++i) {
    const std::string name =
        i < compressed_.size() ? layout_[compressed_[i]].name : kDensePathGroup;
    buffers.emplace_back("optimizer/decay_momentum/" + name, decay_momentum_[i]);
    buffers.emplace_back("dgc/momentum/" + name, compressor_->momentum(i));
    buffers.emplace_back("dgc/velocity/" + name, compressor_->velocity(i));
  }
  return buffers;
}

std::string DeviceStep::rng_state() const {
  std::ostringstream out;
  out << compressor_->rng();
  return out.str();
}

void DeviceStep::set_rng_state(const std::string& text) {
  std::istringstream in(text);
  std::mt19937_64 rng;
  in >> rng;
  if (!in) throw InvalidArgument("the compressor's RNG state is malformed");
  compressor_->rng() = rng;
}

}  // namespace dgc::python
