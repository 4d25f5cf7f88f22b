// dgc bench exchange's workload and its check (bench_exchange.h): gradients and selections that
// every rank can regenerate from the seeds, and the reference check of the exchange's output.
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dgc/cli/bench_exchange.h"
#include "dgc/core/error.h"
#include "dgc/core/options.h"
#include "dgc/core/selection.h"
#include "dgc/exchange/reference.h"

namespace dgc::cli::bench_exchange {
namespace {

// splitmix64's finalizer: a bijective 64-bit mix.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Rank `rank`'s gradient number `variant` (see BenchExchangeOptions::gradients).
uint64_t gradient_stream(uint64_t seed, int rank, int variant) {
  return mix64(mix64(seed + static_cast<uint64_t>(variant)) ^
               (0x632be59bd9b4e019ULL * (static_cast<uint64_t>(rank) + 1)));
}

// Gradient element `index` of rank `stream`: uniform in [-1, 1) on a 2^-23 grid.
float gradient_value(uint64_t stream, uint64_t index) {
  const uint64_t h = mix64(stream + index * 0xd1b54a32d192ed03ULL);
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * 0x1p-23f;
}
std::mt19937_64 selection_rng(uint64_t seed, int rank, int variant) {
  return std::mt19937_64(mix64(gradient_stream(seed, rank, variant) ^ 0x5e1ec7ULL));
}

}  // namespace

void fill_gradient(uint64_t seed, int rank, int variant, std::span<float> out) {
  const uint64_t stream = gradient_stream(seed, rank, variant);
  for (size_t i = 0; i < out.size(); ++i) out[i] = gradient_value(stream, i);
}

// The selection rank `rank` makes on its gradient `variant` (a pure function of seed, rank and
// variant).
void select_for_rank(const BenchExchangeOptions& o, int rank, int variant,
                     std::span<const float> gradient, Selection& out) {
  std::mt19937_64 rng = selection_rng(o.seed, rank, variant);
  select_sampled(gradient, target_count(gradient.size(), o.density), o.density, SelectionOptions{},
                 rng, out);
}

// Checks this rank's exchange output with the reference (dgc::check_update): every rank's
// selection regenerated from the seeds, every rank's `unapplied` as gathered. The dense-path part
// against the directly computed average. Returns the number of mismatches.
int64_t verify_exchange(const BenchExchangeOptions& o, int world_size, int my_rank, int variant,
                        const Selection& my_selection, std::span<const Selection> unapplied,
                        std::span<const float> update, std::span<const float> dense_part,
                        std::span<float> scratch, std::string& first_problem) {
  const ValueType type = parse_value_type(o.value_type);
  std::vector<Selection> selected(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    if (r == my_rank) {
      selected[r] = my_selection;
      continue;
    }
    const std::span<float> peer_gradient = scratch.first(static_cast<size_t>(o.numel));
    fill_gradient(o.seed, r, variant, peer_gradient);
    select_for_rank(o, r, variant, peer_gradient, selected[r]);
  }
  const ReferenceCheck check = check_update(selected, unapplied, update, type);
  int64_t mismatches = check.mismatches;
  if (!check.ok()) first_problem = check.first;

  // Dense-path part: the average over ranks.
  const double inv_n = 1.0 / world_size;
  for (size_t j = 0; j < dense_part.size(); ++j) {
    const uint64_t position = static_cast<uint64_t>(o.numel) + j;
    double sum = 0.0;
    double magnitude = 0.0;
    for (int r = 0; r < world_size; ++r) {
      const float g = gradient_value(gradient_stream(o.seed, r, 0), position);
      sum += g;
      magnitude += std::fabs(g);
    }
    mismatches += !(std::fabs(dense_part[j] - sum * inv_n) <= 1e-6 * magnitude * inv_n + 1e-30);
  }
  return mismatches;
}

// Every rank's `unapplied` (one tensor) through the communicator: u32 indices then f32 values.
std::vector<Selection> gather_unapplied(comm::Communicator& comm, const Selection& mine,
                                        comm::Timeout timeout) {
  std::vector<uint8_t> bytes(8 * mine.indices.size());
  if (!mine.indices.empty()) {
    std::memcpy(bytes.data(), mine.indices.data(), 4 * mine.indices.size());
    std::memcpy(bytes.data() + 4 * mine.indices.size(), mine.values.data(), 4 * mine.values.size());
  }
  std::vector<Selection> all;
  for (const auto& m : comm.allgatherv(bytes, timeout)) {
    DGC_CHECK_EQ(m.size() % 8, size_t{0}, "unapplied message");
    Selection s;
    const size_t count = m.size() / 8;
    s.indices.resize(count);
    s.values.resize(count);
    if (count > 0) {
      std::memcpy(s.indices.data(), m.data(), 4 * count);
      std::memcpy(s.values.data(), m.data() + 4 * count, 4 * count);
    }
    all.push_back(std::move(s));
  }
  return all;
}

// Checks the dense allreduce result against the directly computed sum. Returns mismatches.
int64_t verify_dense(const BenchExchangeOptions& o, int world_size, std::span<const float> summed) {
  std::vector<uint64_t> streams(world_size);
  for (int r = 0; r < world_size; ++r) streams[r] = gradient_stream(o.seed, r, 0);
  int64_t mismatches = 0;
  for (size_t i = 0; i < summed.size(); ++i) {
    double sum = 0.0;
    double magnitude = 0.0;
    for (int r = 0; r < world_size; ++r) {
      const float g = gradient_value(streams[r], i);
      sum += g;
      magnitude += std::fabs(g);
    }
    mismatches += !(std::fabs(summed[i] - sum) <= 1e-6 * magnitude + 1e-30);
  }
  return mismatches;
}

}  // namespace dgc::cli::bench_exchange
