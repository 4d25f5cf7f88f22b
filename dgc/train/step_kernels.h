// The element loops of DistributedStep (step.h): reading the gradients into the dense-path buffer,
// and phase 5, the directions, either written out (DistributedStep::run) or applied to the
// weights in the same pass (DistributedStep::run_and_apply: w -= lr * direction, the direction
// never stored). Internal to dgc::train; not part of the API.
//
// Every applying kernel gives the weights bit for bit what writing the direction d and then
// `w[e] -= lr * d[e]` gives: the same float operations in the same order, never contracted into
// fused multiply-adds (step_kernels.cc is compiled with -ffp-contract=off). They only save the
// passes: per element each buffer of the state is read and written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dgc::train::kernels {

// The factors of phase 5: momentum m, weight decay wd (already scaled by the learning-rate
// factor), the learning rate the direction is applied at (run_and_apply only) and Nesterov.
struct DirectionFactors {
  float m = 0.0f;
  float wd = 0.0f;
  float lr = 0.0f;
  bool nesterov = false;
};

// out[e] = in[e] for e < n; returns whether every value is finite (NaN and infinity are copied
// too). One read of `in`, one write of `out`.
bool copy_finite(const float* in, float* out, size_t n);

// A dense-path tensor (ordinary momentum SGD on the average `avg`):
//   g = avg + wd*w; u = m*u + g; d = u (Nesterov: g + m*u)
// dense_direction writes d to `out`; dense_apply sets w -= lr * d instead.
void dense_direction(const float* avg, const float* w, float* u, float* out, size_t n,
                     const DirectionFactors& f);
void dense_apply(const float* avg, float* w, float* u, size_t n, const DirectionFactors& f);

// A compressed tensor (and with the grouped dense path, a slice of the group): weight decay
// through its own momentum b, then the received update, which holds the momentum already:
//   b = m*b + wd*w; d = b + update (Nesterov: wd*w + m*b + update); wd = 0: d = update.
void compressed_direction(const float* w, const float* update, float* b, float* out, size_t n,
                          const DirectionFactors& f);

// The same applied to the weights, w -= lr * d, reading the update only where the exchange wrote
// it (Exchange::last_written; every other position of the update buffer is +0, where
// d = b-term + 0). In three steps, so that several tensors can share one update buffer (the
// grouped dense path): save() the weights at the written positions, apply_decay() to every
// tensor (b and w over every element, as if nothing were received; not needed with wd = 0, where
// d = 0 and w stays as it is there), then finish() on the written positions.
class SparseApply {
 public:
  // One tensor's place in the update buffer: elements [begin, begin + n) are its w[0, n) and
  // b[0, n) (b unused with wd = 0).
  struct Segment {
    uint64_t begin = 0;
    size_t n = 0;
    float* w = nullptr;
    float* b = nullptr;
  };
  // Remembers w at every position (of the update buffer; may repeat, any order). `segments` are
  // sorted by begin, disjoint, and cover every position (dgc::InvalidArgument otherwise).
  void save(std::span<const uint64_t> positions, std::span<const Segment> segments);
  // b = m*b + wd*w; w -= lr * (b + 0) (Nesterov: wd*w + m*b + 0) over n elements.
  static void apply_decay(float* w, float* b, size_t n, const DirectionFactors& f);
  // At every saved position p: w = w_saved - lr * (b-term + update[p]) with the b-term from
  // w_saved and the b that apply_decay() left (wd = 0: w_saved - lr * update[p]). A position
  // saved twice gets the same value twice. Then forgets what was saved.
  void finish(const float* update, const DirectionFactors& f);

 private:
  struct Saved {
    uint64_t position;  // in the update buffer
    float* w;
    float* b;
    float value;  // w before apply_decay()
  };
  std::vector<Saved> saved_;
};

}  // namespace dgc::train::kernels
