// Test data for the exchange, shared by the in-process tests and the multi-process worker: a
// small model layout, rank-distinct random sparse selections (with indices that collide across
// ranks) and dense gradients, and the directly computed expected result (sum over ranks / N).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dgc/core/selection.h"
#include "dgc/exchange/exchange.h"
#include "dgc/exchange/reference.h"

namespace dgc::test {

// Two compressed tensors (2-D, >= 1024 elements) and three dense ones, interleaved.
inline std::vector<TensorSpec> model_layout(int64_t fc_inputs = 300) {
  PolicyOptions policy;
  policy.min_numel = 1024;
  return make_layout({{"conv.weight", {16, 8, 3, 3}},
                      {"conv.bias", {16}},
                      {"fc.weight", {10, fc_inputs}},
                      {"fc.bias", {10}},
                      {"norm.weight", {16}}},
                     policy);
}

inline uint64_t seed_of(int rank, uint64_t iteration, size_t tensor) {
  return 1000003ull * static_cast<uint64_t>(rank + 1) + 7919ull * iteration + tensor;
}

// About `count` sorted unique indices in [0, numel): always 0 and numel - 1 (so every rank
// collides there), the rest drawn from the first 4 * count elements (so ranks collide often).
// Values are multiples of 1/64 in [-2, 2], exact in fp32, fp16 and bf16.
inline Selection random_selection(uint64_t numel, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<uint32_t> indices = {0, static_cast<uint32_t>(numel - 1)};
  const uint64_t range = std::min<uint64_t>(numel, 4 * count);
  while (indices.size() < std::min<uint64_t>(count, numel)) {
    indices.insert(static_cast<uint32_t>(rng() % range));
  }
  Selection s;
  s.indices.assign(indices.begin(), indices.end());
  for (size_t i = 0; i < s.indices.size(); ++i) {
    float v = static_cast<float>(static_cast<int64_t>(rng() % 257) - 128) / 64.0f;
    if (v == 0.0f) v = 1.0f / 64.0f;
    s.values.push_back(v);
  }
  return s;
}

// How the ranks' indices fall.
enum class Pattern {
  kColliding,  // random_selection: 0 and numel - 1 on every rank, the rest in a narrow range
  kUniform,    // uniform over the tensor
  kSkewed,     // most indices near the start of the tensor (numel * u^4)
  kDisjoint,   // rank r only at indices = r (mod 8): no two ranks (N <= 8) share one
  kEmpty,      // even ranks send nothing; every rank sends nothing at even iterations
};

inline const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kColliding:
      return "colliding";
    case Pattern::kUniform:
      return "uniform";
    case Pattern::kSkewed:
      return "skewed";
    case Pattern::kDisjoint:
      return "disjoint";
    case Pattern::kEmpty:
      return "empty";
  }
  return "?";
}

inline Selection pattern_selection(Pattern pattern, uint64_t numel, size_t count, int rank,
                                   uint64_t iteration, uint64_t seed) {
  if (pattern == Pattern::kColliding) return random_selection(numel, count, seed);
  std::mt19937_64 rng(seed);
  std::set<uint32_t> indices;
  if (pattern == Pattern::kEmpty && (rank % 2 == 0 || iteration % 2 == 0)) count = 0;
  count = std::min<size_t>(count, numel / 8);
  for (size_t tries = 0; indices.size() < count && tries < 100 * count; ++tries) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    uint64_t index = 0;
    switch (pattern) {
      case Pattern::kSkewed:
        index = static_cast<uint64_t>(static_cast<double>(numel) * u * u * u * u);
        break;
      case Pattern::kDisjoint:
        index = 8 * static_cast<uint64_t>(u * static_cast<double>(numel / 8)) +
                static_cast<uint64_t>(rank);
        break;
      default:
        index = static_cast<uint64_t>(u * static_cast<double>(numel));
        break;
    }
    if (index < numel) indices.insert(static_cast<uint32_t>(index));
  }
  Selection s;
  s.indices.assign(indices.begin(), indices.end());
  for (size_t i = 0; i < s.indices.size(); ++i) {
    float v = static_cast<float>(static_cast<int64_t>(rng() % 257) - 128) / 64.0f;
    if (v == 0.0f) v = 1.0f / 64.0f;
    s.values.push_back(v);
  }
  return s;
}

// This rank's inputs for one iteration.
struct RankInputs {
  std::vector<Selection> selections;  // per compressed tensor
  std::vector<float> dense;           // the dense-path tensors, concatenated
};

inline RankInputs rank_inputs(const std::vector<TensorSpec>& layout, int rank, uint64_t iteration,
                              Pattern pattern = Pattern::kColliding) {
  RankInputs in;
  size_t c = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto numel = static_cast<uint64_t>(layout[t].numel());
    if (layout[t].path == TensorPath::kCompressed) {
      const size_t count = 5 + (rank * 3 + iteration) % 17;
      in.selections.push_back(
          pattern_selection(pattern, numel, count, rank, iteration, seed_of(rank, iteration, c++)));
    } else {
      for (uint64_t j = 0; j < numel; ++j) {
        in.dense.push_back(0.5f * static_cast<float>(rank + 1) + static_cast<float>(j % 3) -
                           0.25f * static_cast<float>(iteration));
      }
    }
  }
  return in;
}

// Expected outputs: per compressed tensor the dense sum over ranks of the selections / N, and
// the average of the dense gradients. Computed in double, directly.
struct Expected {
  std::vector<std::vector<double>> updates;
  std::vector<double> dense;
};

inline Expected expected_result(const std::vector<TensorSpec>& layout, int world_size,
                                uint64_t iteration, Pattern pattern = Pattern::kColliding) {
  Expected e;
  for (const auto& t : layout) {
    if (t.path == TensorPath::kCompressed) e.updates.emplace_back(t.numel(), 0.0);
  }
  for (int r = 0; r < world_size; ++r) {
    const auto in = rank_inputs(layout, r, iteration, pattern);
    for (size_t c = 0; c < in.selections.size(); ++c) {
      for (size_t i = 0; i < in.selections[c].indices.size(); ++i) {
        e.updates[c][in.selections[c].indices[i]] += in.selections[c].values[i];
      }
    }
    if (e.dense.empty()) e.dense.assign(in.dense.size(), 0.0);
    for (size_t j = 0; j < in.dense.size(); ++j) e.dense[j] += in.dense[j];
  }
  for (auto& u : e.updates) {
    for (auto& x : u) x /= world_size;
  }
  for (auto& x : e.dense) x /= world_size;
  return e;
}

// Largest |got - expected| over all outputs.
inline double max_error(const Expected& e, const std::vector<std::vector<float>>& updates,
                        const std::vector<float>& dense) {
  double worst = 0.0;
  for (size_t c = 0; c < e.updates.size(); ++c) {
    for (size_t i = 0; i < e.updates[c].size(); ++i) {
      worst = std::max(worst, std::abs(updates[c][i] - e.updates[c][i]));
    }
  }
  for (size_t j = 0; j < e.dense.size(); ++j) {
    worst = std::max(worst, std::abs(dense[j] - e.dense[j]));
  }
  return worst;
}

// Every rank's `unapplied`, gathered through the communicator (u32 count, then u32 indices and
// float values, per compressed tensor).
inline std::vector<std::vector<Selection>> gather_unapplied(comm::Communicator& comm,
                                                            const std::vector<Selection>& mine) {
  std::vector<uint8_t> bytes;
  auto put = [&](const void* p, size_t size) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + size);
  };
  for (const auto& s : mine) {
    const auto count = static_cast<uint32_t>(s.indices.size());
    put(&count, 4);
    put(s.indices.data(), 4 * s.indices.size());
    put(s.values.data(), 4 * s.values.size());
  }
  std::vector<std::vector<Selection>> all;
  for (const auto& m : comm.allgatherv(bytes, comm.default_timeout())) {
    std::vector<Selection> theirs(mine.size());
    size_t at = 0;
    for (auto& s : theirs) {
      uint32_t count = 0;
      std::memcpy(&count, m.data() + at, 4);
      at += 4;
      s.indices.resize(count);
      s.values.resize(count);
      if (count > 0) {  // an empty vector's data() may be null, which memcpy must not see
        std::memcpy(s.indices.data(), m.data() + at, 4 * count);
        std::memcpy(s.values.data(), m.data() + at + 4 * count, 4 * count);
      }
      at += 8 * count;
    }
    all.push_back(std::move(theirs));
  }
  return all;
}

// The reference check of every compressed tensor of this rank's updates at `iteration`
// (reference.h), with every rank's `unapplied` gathered through `comm` (collective). Returns the
// number of problems; `first` gets the first one.
inline int64_t check_against_reference(comm::Communicator& comm,
                                       const std::vector<TensorSpec>& layout, uint64_t iteration,
                                       Pattern pattern, const std::vector<Selection>& unapplied,
                                       const std::vector<std::vector<float>>& updates,
                                       ValueType type, std::string& first) {
  const auto all_unapplied = gather_unapplied(comm, unapplied);
  int64_t problems = 0;
  for (size_t c = 0; c < updates.size(); ++c) {
    std::vector<Selection> selected, back;
    for (int r = 0; r < comm.size(); ++r) {
      selected.push_back(rank_inputs(layout, r, iteration, pattern).selections[c]);
      back.push_back(all_unapplied[r][c]);
    }
    const ReferenceCheck check = check_update(selected, back, updates[c], type);
    problems += check.mismatches;
    if (first.empty()) first = check.first;
  }
  return problems;
}

// Spans over a vector of buffers, as Exchange::run takes them.
inline std::vector<std::span<float>> spans(std::vector<std::vector<float>>& buffers) {
  std::vector<std::span<float>> out;
  for (auto& b : buffers) out.emplace_back(b);
  return out;
}

}  // namespace dgc::test
