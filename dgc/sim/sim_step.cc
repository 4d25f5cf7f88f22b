#include "dgc/sim/sim_step.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "dgc/core/compressor.h"
#include "dgc/core/error.h"
#include "dgc/exchange/exchange.h"
#include "dgc/exchange/reference.h"
#include "dgc/sim/compute.h"
#include "dgc/sim/synthetic.h"

namespace dgc::sim {
namespace {

// A float buffer: an SMPI shared allocation (every rank's at this call site is the same
// physical memory) or the rank's own, zeroed.
struct FloatBuffer {
  // touch: write every page now (set-up), so that no timed step pays the first-touch faults.
  FloatBuffer(size_t n, bool shared, bool touch) : size(n), shared(shared) {
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    data = static_cast<float*>(shared ? SMPI_SHARED_MALLOC(bytes) : std::calloc(n + 1, 4));
    DGC_CHECK(data != nullptr, "out of memory allocating ", bytes, " bytes");
    if (touch) std::memset(data, 0, bytes);
  }
  ~FloatBuffer() { shared ? SMPI_SHARED_FREE(data) : std::free(data); }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  std::span<float> span(size_t offset, size_t n) const { return {data + offset, n}; }
  float* data;
  size_t size;
  bool shared;
};

// Charges `seconds` of computation to this rank's simulated host without spending CPU.
// smpi_execute alone (and SMPI_SAMPLE_DELAY, which is a for loop around it) leaves the rank's
// benchmark timer running while it yields, so the CPU that other ranks burn meanwhile (on the
// same OS thread) would be charged to this one at its next MPI call; the timer is stopped around
// it.
void charge(double seconds) {
  smpi_bench_end();
  smpi_execute(seconds);
  smpi_bench_begin();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// w -= lr * update (the weight update of every element).
void apply(const FloatBuffer& weights, std::span<const float> update, size_t offset, float lr) {
  float* w = weights.data + offset;
  for (size_t i = 0; i < update.size(); ++i) w[i] -= lr * update[i];
}

void put(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

void put_selection(std::vector<uint8_t>& out, const Selection& s) {
  const uint64_t n = s.indices.size();
  put(out, &n, sizeof n);
  put(out, s.indices.data(), n * sizeof(uint32_t));
  put(out, s.values.data(), n * sizeof(float));
}

Selection get_selection(const uint8_t*& p) {
  uint64_t n = 0;
  std::memcpy(&n, p, sizeof n);
  p += sizeof n;
  Selection s;
  s.indices.resize(n);
  s.values.resize(n);
  std::memcpy(s.indices.data(), p, n * sizeof(uint32_t));
  p += n * sizeof(uint32_t);
  std::memcpy(s.values.data(), p, n * sizeof(float));
  p += n * sizeof(float);
  return s;
}

// Every rank's selections and hand-backs gathered, and every compressed tensor's update checked
// against the reference (dgc/exchange/reference.h). Returns the mismatches.
int64_t check_step(comm::Communicator& comm, std::span<const Selection> selections,
                   std::span<const Selection> unapplied,
                   const std::vector<std::span<float>>& updates) {
  std::vector<uint8_t> mine;
  for (size_t t = 0; t < selections.size(); ++t) {
    put_selection(mine, selections[t]);
    put_selection(mine, unapplied.empty() ? Selection{} : unapplied[t]);
  }
  const auto all = comm.allgatherv(mine);
  const size_t n = all.size();
  std::vector<std::vector<Selection>> selected(selections.size()), returned(selections.size());
  for (size_t r = 0; r < n; ++r) {
    const uint8_t* p = all[r].data();
    for (size_t t = 0; t < selections.size(); ++t) {
      selected[t].push_back(get_selection(p));
      returned[t].push_back(get_selection(p));
    }
  }
  int64_t mismatches = 0;
  for (size_t t = 0; t < selections.size(); ++t) {
    mismatches +=
        check_update(selected[t], returned[t], updates[t], ValueType::kFloat32).mismatches;
  }
  return mismatches;
}

// Per step, this rank's simulated times: compute, compress, exchange, update, step.
struct StepTimes {
  double part[5] = {0, 0, 0, 0, 0};
};

class Runner {
 public:
  Runner(comm::Communicator& comm, const std::vector<train::NamedShape>& shapes,
         const SimOptions& o)
      : comm_(comm),
        o_(o),
        layout_(make_layout(shapes, PolicyOptions{})),
        index_(index_layout(layout_)),
        sampled_(is_sampled(comm, o)),
        shared_(!o.private_buffers && !sampled_),
        weights_(index_.total_numel, shared_, sampled_) {
    const int n = comm.size();
    const int s = o.sample_ranks <= 0 ? n : std::min(o.sample_ranks, n);
    sampled_count_ = s;
    compute_ = o.compute_seconds >= 0 ? o.compute_seconds : default_compute_seconds().at(o.model);
  }

  SimResult run(const std::string& algorithm) {
    SimResult result;
    result.algorithm = algorithm;
    result.sampled = sampled_count_;
    std::vector<StepTimes> times;
    if (algorithm == "dense") {
      times = run_dense(result);
    } else {
      times = run_dgc(parse_exchange_algorithm(algorithm), result);
    }
    // The slowest rank's part, per timed step; then medians.
    std::vector<double> parts[5], sampled_exchange;
    for (const StepTimes& t : times) {
      double slowest[5];
      MPI_Allreduce(t.part, slowest, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      for (int i = 0; i < 5; ++i) parts[i].push_back(slowest[i]);
      const double mine = sampled_ ? t.part[2] : 0.0;
      double slowest_sampled = 0.0;
      MPI_Allreduce(&mine, &slowest_sampled, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      sampled_exchange.push_back(slowest_sampled);
    }
    result.exchange_sampled = median(sampled_exchange);
    result.compute = median(parts[0]);
    result.compress = median(parts[1]);
    result.exchange = median(parts[2]);
    result.update = median(parts[3]);
    result.step = median(parts[4]);
    return result;
  }

 private:
  // Whether this rank compresses and updates for real: sample_ranks of them, spread evenly.
  static bool is_sampled(const comm::Communicator& comm, const SimOptions& o) {
    const int n = comm.size();
    const int s = o.sample_ranks <= 0 ? n : std::min(o.sample_ranks, n);
    return (static_cast<int64_t>(comm.rank()) * s) % n < s;
  }

  // The sampled ranks' mean of `mine` (their time of a phase in the last warm-up step).
  double sampled_mean(double mine) {
    double in[2] = {sampled_ ? mine : 0.0, sampled_ ? 1.0 : 0.0}, out[2];
    MPI_Allreduce(in, out, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return out[1] > 0 ? out[0] / out[1] : 0.0;
  }

  // Phase 1: the forward and backward pass, in simulated time only.
  void compute() { charge(compute_); }

  std::vector<StepTimes> run_dense(SimResult& result) {
    FloatBuffer grad(index_.total_numel, shared_, sampled_);
    const float scale = 1.0f / static_cast<float>(comm_.size());
    const int n = comm_.size();
    if (o_.check) result.check_mismatches = 0;
    std::vector<StepTimes> times;
    double update_cost = 0.0;
    for (int s = 0; s < o_.warmup_steps + o_.steps; ++s) {
      const bool timed = s >= o_.warmup_steps;
      comm_.barrier();
      const auto before = comm_.bytes();
      StepTimes t;
      const double t0 = MPI_Wtime();
      if (o_.check) std::fill(grad.data, grad.data + grad.size, float(comm_.rank() + 1));
      compute();
      const double t1 = MPI_Wtime();
      comm_.allreduce_sum(grad.span(0, grad.size));
      const double t2 = MPI_Wtime();
      if (o_.check) {  // every element is 1 + 2 + ... + N
        result.check_mismatches += std::count_if(
            grad.data, grad.data + grad.size, [&](float g) { return g != float(n * (n + 1) / 2); });
      }
      if (sampled_) {
        for (size_t i = 0; i < grad.size; ++i) weights_.data[i] -= o_.lr * scale * grad.data[i];
      } else {
        charge(update_cost);
      }
      const double t3 = MPI_Wtime();
      if (s == o_.warmup_steps - 1) update_cost = sampled_mean(t3 - t2);
      result.wire_sent = comm_.bytes().sent - before.sent;
      result.wire_received = comm_.bytes().received - before.received;
      result.message_bytes = 4 * index_.total_numel;
      if (timed) times.push_back({{t1 - t0, 0.0, t2 - t1, t3 - t2, t3 - t0}});
    }
    return times;
  }

  std::vector<StepTimes> run_dgc(ExchangeAlgorithm algorithm, SimResult& result);

  comm::Communicator& comm_;
  const SimOptions& o_;
  std::vector<TensorSpec> layout_;
  LayoutIndex index_;
  bool sampled_ = false;
  // Whether this rank's weights, gradient and update buffers are SMPI shared allocations:
  // not on the sampled ranks, whose update and decode must touch memory as a real rank's do
  // (a shared allocation maps one small block many times over and stays in cache).
  bool shared_ = false;
  FloatBuffer weights_;
  int sampled_count_ = 0;
  double compute_ = 0.0;
};

std::vector<StepTimes> Runner::run_dgc(ExchangeAlgorithm algorithm, SimResult& result) {
  const int rank = comm_.rank();
  const size_t tensors = index_.compressed.size();
  ExchangeOptions eo;
  eo.algorithm = algorithm;
  eo.density = o_.density;
  eo.settings = "model=" + o_.model;
  // The ranks that are not sampled keep no record of the positions they write (N x k of them:
  // 52 MB per rank for ResNet-50 at 256 ranks) and zero their shared update buffer in full.
  eo.record_written = sampled_;
  Exchange exchange(comm_, layout_, eo);

  // This rank's selections (synthetic, fixed over the steps) and, on sampled ranks, the
  // compressor and a gradient whose top-k is that selection.
  const SyntheticOptions so{.density = o_.density, .overlap = o_.overlap, .seed = o_.seed};
  std::vector<Selection> selections(tensors), unapplied;
  for (size_t t = 0; t < tensors; ++t) {
    selections[t].indices = synthetic_indices(index_.compressed_numels[t], t, rank, so);
    selections[t].values.assign(selections[t].indices.size(), 1.0f);
  }
  // Rank 0 (which reports): the share of its indices, over every tensor, that rank 1 selects too.
  double shared = 0.0, selected = 0.0;
  for (size_t t = 0; t < tensors && rank == 0; ++t) {
    const auto& mine = selections[t].indices;
    const auto other = synthetic_indices(index_.compressed_numels[t], t, 1, so);
    shared += shared_fraction(mine, other) * double(mine.size());
    selected += double(mine.size());
  }
  if (selected > 0) result.overlap_measured = shared / selected;
  if (algorithm == ExchangeAlgorithm::kSparseAllreduce) unapplied.resize(tensors);
  std::optional<Compressor> compressor;
  std::vector<std::vector<float>> grads;
  if (sampled_) {
    std::vector<int64_t> numels(index_.compressed_numels.begin(), index_.compressed_numels.end());
    CompressionOptions co;
    co.seed = o_.seed + static_cast<uint64_t>(rank);
    compressor.emplace(numels, co);
    grads.resize(tensors);
    for (size_t t = 0; t < tensors; ++t) {
      grads[t].resize(index_.compressed_numels[t]);
      synthetic_gradient(grads[t], selections[t].indices, t, rank, o_.seed);
    }
  }
  FloatBuffer update_buffer(index_.offsets.back(), shared_, true);
  std::vector<std::span<float>> updates(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    updates[t] = update_buffer.span(index_.offsets[t], index_.compressed_numels[t]);
  }
  std::vector<float> dense_flat(index_.dense_numel, 0.001f * static_cast<float>(rank + 1));

  std::vector<StepTimes> times;
  double compress_cost = 0.0, update_cost = 0.0;
  result.check_mismatches = o_.check ? 0 : -1;
  for (int s = 0; s < o_.warmup_steps + o_.steps; ++s) {
    const bool timed = s >= o_.warmup_steps;
    comm_.barrier();
    const double t0 = MPI_Wtime();
    compute();
    const double t1 = MPI_Wtime();
    // Phase 2: compression (momentum correction, selection, masking) of every tensor.
    if (sampled_) {
      for (size_t t = 0; t < tensors; ++t) {
        compressor->step(t, grads[t], o_.density, selections[t]);
      }
    } else if (timed) {
      charge(compress_cost);
    }
    const double t2 = MPI_Wtime();
    if (o_.exchange_barrier) comm_.barrier();
    const double t2_start = MPI_Wtime();
    // Phase 3: the exchange.
    exchange.run(static_cast<uint64_t>(s), selections, updates, dense_flat, true, unapplied);
    const double t3 = MPI_Wtime();
    if (sampled_ && !unapplied.empty()) {
      for (size_t t = 0; t < tensors; ++t) compressor->return_to_velocity(t, unapplied[t]);
    }
    // Phase 4: the weight update of every element.
    if (sampled_) {
      for (size_t t = 0; t < tensors; ++t) {
        apply(weights_, updates[t], index_.offsets[t], static_cast<float>(o_.lr));
      }
      apply(weights_, dense_flat, index_.offsets.back(), static_cast<float>(o_.lr));
    } else if (timed) {
      charge(update_cost);
    }
    const double t4 = MPI_Wtime();
    if (s == o_.warmup_steps - 1) {
      compress_cost = sampled_mean(t2 - t1);
      update_cost = sampled_mean(t4 - t3);
    }
    const auto& timings = exchange.last_timings();
    result.exchange_cpu = timings.encode + timings.validate + timings.decode;
    result.message_bytes = exchange.last().message;
    result.wire_sent = exchange.last().wire_sent;
    result.wire_received = exchange.last().wire_received;
    if (o_.check) result.check_mismatches += check_step(comm_, selections, unapplied, updates);
    if (timed) times.push_back({{t1 - t0, t2 - t1, t3 - t2_start, t4 - t3, t4 - t0}});
  }
  return times;
}

}  // namespace

SimResult run_configuration(comm::Communicator& comm, const std::vector<train::NamedShape>& shapes,
                            const std::string& algorithm, const SimOptions& options) {
  DGC_CHECK(!options.check || options.private_buffers,
            "the reference check needs private buffers (shared ones mix the ranks' updates)");
  DGC_CHECK(options.sample_ranks <= 0 || options.warmup_steps > 0,
            "sampling needs at least one warm-up step (the sampled ranks' calibration)");
  Runner runner(comm, shapes, options);
  return runner.run(algorithm);
}

}  // namespace dgc::sim
