// The DGC exchange: one fused message per worker per iteration over a dgc::comm::Communicator.
//
// Per iteration every rank encodes its selections for all compressed tensors into one message
// (the core codec, with the bad-gradient flag in its checksummed header), the messages travel by
// the configured algorithm (algorithm.h: allgather or direct all-to-all in allgather.h, or the
// sparse allreduce of sparse_allreduce.h), and every rank decodes them into the update buffers
// (colliding indices add), scaled by 1/N. Tensors on the dense path travel fused in one flat
// buffer, one allreduce per iteration, averaged (dense_path.h).
//
// Where the pieces live: the layout in layout.h, the start-up handshake and the parameter
// broadcast in handshake.h, what the algorithms share (job identity, encoder, validation, phase
// clock) in context.h. Exchange::run below strings them together and is the one place that
// counts bytes (ExchangeBytes) and times phases (ExchangeTimings).
//
// Job identity: rank 0 draws a random run id (auth.h) and every rank learns it at the handshake;
// every message carries it and the iteration, and a message of another job or another iteration
// is refused (DecodeError kForeignRun / kWrongIteration) before anything is applied. With a job
// key (ExchangeOptions::message_key) every message, the dense path and the handshake carry an
// HMAC-SHA256 tag bound to the run id, the iteration and the sender (and receiver), and anything
// without a valid tag is refused (DecodeError kBadTag; AuthenticationError at the handshake).
// The dense path then travels as one tagged allgatherv instead of the allreduce (every rank sums
// the ranks' buffers in rank order), since a ring allreduce's partial sums cannot be tagged.
//
// All functions here are collective unless stated otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dgc/comm/communicator.h"
#include "dgc/core/codec.h"
#include "dgc/core/options.h"
#include "dgc/core/policy.h"
#include "dgc/core/selection.h"
#include "dgc/exchange/algorithm.h"
#include "dgc/exchange/context.h"
#include "dgc/exchange/handshake.h"
#include "dgc/exchange/layout.h"
#include "dgc/exchange/sparse_allreduce.h"

namespace dgc {

struct ExchangeOptions {
  ValueType value_type = ValueType::kFloat32;
  comm::Timeout timeout = comm::kUnsetTimeout;
  // The collective (algorithm.h). kAuto picks one with choose_algorithm(N, density, numel).
  ExchangeAlgorithm algorithm = ExchangeAlgorithm::kAllgather;
  // The density after warm-up, for kAuto's rule only.
  double density = 0.001;
  // kSparseAllreduce: runs between re-balances of the region bounds (>= 1).
  int rebalance_interval = 16;
  // Wire type of the dense path. kFloat32: one allreduce of the fp32 buffer. kFloat16 /
  // kBFloat16: every rank's buffer travels as 16-bit values (allgatherv; the caller rounds with
  // error feedback first, see round_with_residual in dgc/core/compressor.h, so the conversion
  // loses nothing more), and every rank sums the ranks' values in rank order in fp32.
  ValueType dense_value_type = ValueType::kFloat32;
  // Index into the layout of a compressed tensor that carries the dense-path tensors grouped
  // into one (dgc::train's DensePath::kGrouped), if any: its entries count as dense-path bytes
  // in ExchangeBytes. It is exchanged like every compressed tensor.
  std::optional<size_t> dense_path_group;
  // Free-form description of every setting that all ranks must agree on (density, momentum,
  // schedules, ...), as "key=value" lines. The handshake compares it line by line.
  std::string settings;
  // The job's exchange key (JobKeys::exchange of derive_job_keys(secret)), when the job has a
  // secret: every message is tagged and verified (see the top). Every rank must have the same
  // key or none; a difference stops every rank at the handshake with an AuthenticationError.
  std::optional<MacKey> message_key;
  // Whether run() records the positions it writes: last_written(), and the next run()'s reset
  // of only those positions. Off, nothing is recorded: every run() zeroes the update buffers in
  // full and last_written() is an error. That saves N x k positions of 8 bytes per rank (52 MB
  // for ResNet-50 at 256 ranks); the simulated cluster (dgc/sim) turns it off on the ranks whose
  // times it does not report. sparse-allreduce always records (its hand-back needs them).
  bool record_written = true;
};

// Bytes for one iteration and cumulative. "message" bytes are what this worker contributes (its
// encoded message(s) plus the dense-path values, 4 or 2 bytes per element); "wire" bytes are what
// the collectives put on the wire from this rank (allgather forwards others' messages; a ring
// allreduce sends 2(N-1)/N of its buffer). The message bytes split into three parts:
// message_compressed + message_dense_path + message_headers == message.
struct ExchangeBytes {
  uint64_t message = 0;             // this worker's compressed message + dense-path values
  uint64_t message_compressed = 0;  // the entries of the compressed tensors in the message
  // The dense path: its values, or the entry of the dense-path group (dense_path_group).
  uint64_t message_dense_path = 0;
  // The messages' headers (kMessageHeaderBytes each) and, with a job key, their tags and the
  // dense path's tag (kTagBytes each).
  uint64_t message_headers = 0;
  uint64_t dense_gradient = 0;  // 4 bytes x every element of every tensor (the paper's baseline)
  uint64_t wire_sent = 0;       // bytes this rank sent in the collectives
  uint64_t wire_received = 0;
  uint64_t dense_wire_sent = 0;  // what a dense ring allreduce of the whole gradient would send
  ExchangeBytes& operator+=(const ExchangeBytes& other);
  ExchangeBytes& operator-=(const ExchangeBytes& other);  // field by field (counters' differences)
};

// Seconds spent in each phase of the last Exchange::run on this rank (steady clock):
//   encode:     building this rank's message(s) (for sparse-allreduce also the owner's message of
//               kept sums);
//   collective: the communicator calls (allgatherv / alltoallv, the dense allreduce);
//   validate:   ValidatedMessage::validate of every received message;
//   decode:     everything else: the owner's reduction and re-selection, resetting and adding into
//               the update buffers, the unapplied hand-back, the dense average.
struct ExchangeTimings {
  double encode = 0.0;
  double collective = 0.0;
  double validate = 0.0;
  double decode = 0.0;
  double total() const { return encode + collective + validate + decode; }
};

class Exchange {
 public:
  // Runs the handshake; the requested and the resolved algorithm are among the settings every
  // rank must share ("exchange.algorithm"), so a rank started with another --exchange stops every
  // rank with a MismatchError. `comm` must outlive the Exchange.
  Exchange(comm::Communicator& comm, std::vector<TensorSpec> layout, ExchangeOptions options);

  // The algorithm run() uses (never kAuto).
  ExchangeAlgorithm algorithm() const { return algorithm_; }
  // The job's run id (from the handshake) and whether messages are authenticated (a job key).
  const RunId& run_id() const { return job_.run_id; }
  bool authenticated() const { return job_.authenticator.has_value(); }

  const std::vector<TensorSpec>& layout() const { return layout_; }
  // Indices into layout() of the compressed and dense tensors, in layout order.
  const std::vector<size_t>& compressed_tensors() const { return index_.compressed; }
  const std::vector<size_t>& dense_tensors() const { return index_.dense; }

  // One iteration.
  //   selections[i]: this rank's selection for compressed tensor i (compressed_tensors()[i]).
  //   updates[i]:    output for compressed tensor i; overwritten with sum over ranks / N (every
  //                  position no rank selected is 0).
  //   dense_flat:    the dense-path gradients concatenated in layout order; replaced in place by
  //                  their average over ranks.
  //   local_ok:      false if this rank's gradient was bad (non-finite): the flag travels in the
  //                  header of this rank's message(s) (kFlagBadGradient), so every rank learns
  //                  how many ranks flagged before anything is applied.
  //   unapplied:     empty, or one Selection per compressed tensor: overwritten with the
  //                  (index, value) pairs of selections[i] that the exchange did not apply
  //                  (sorted by index, values as selected). Always empty for allgather and
  //                  direct; sparse-allreduce drops what its re-selection did not keep, and a
  //                  caller must give it back to the residual, so with that algorithm
  //                  `unapplied` is required when there are compressed tensors
  //                  (dgc::InvalidArgument otherwise).
  // Update buffers: pass the same buffers every iteration and do not write to them between
  // calls. The exchange then resets only the positions it wrote in the previous call instead of
  // zeroing every buffer (most of the decode time at d = 0.001). When a buffer's address or size
  // differs from the previous call's, every buffer is zeroed in full. A caller that must write
  // to the buffers between calls calls forget_updates() first.
  // Returns the number of ranks that passed local_ok == false; when > 0 every rank gets the same
  // count and must not apply the outputs (they are unspecified). A rank that flags still takes
  // part in the collectives so nobody hangs.
  // Throws dgc::CommError / dgc::DecodeError; on a DecodeError it names the sending rank. A
  // message of another job (run id) or another iteration, or, with a job key, one without a
  // valid tag, is a DecodeError (kForeignRun, kWrongIteration, kBadTag) and nothing is applied.
  int run(uint64_t iteration, std::span<const Selection> selections,
          std::span<const std::span<float>> updates, std::span<float> dense_flat,
          bool local_ok = true, std::span<Selection> unapplied = {});

  // Makes the next run() zero the update buffers in full (not thread-safe with run()).
  void forget_updates();

  // The positions the last run() added into updates[i] (compressed tensor i), in message order:
  // a position that several ranks selected appears once per rank. Every other position of
  // updates[i] is 0. Valid until the next run(). A caller that keeps the update elsewhere (the
  // Python package's device step, on the GPU) copies only these values. Needs
  // ExchangeOptions::record_written (dgc::InvalidArgument otherwise).
  std::span<const uint64_t> last_written(size_t i) const;

  const ExchangeBytes& last() const { return last_.bytes; }
  const ExchangeBytes& total() const { return total_; }
  const ExchangeTimings& last_timings() const { return last_.timings; }
  // Elements the last run() added into the updates, over all tensors: allgather and direct count
  // a position once per rank that selected it, sparse-allreduce counts distinct positions.
  uint64_t last_applied() const { return last_.applied; }
  // sparse-allreduce: the current region bounds in the global index space (size N + 1).
  const std::vector<uint64_t>& region_bounds() const { return sparse_.bounds; }

 private:
  bool records_written() const {
    return options_.record_written || algorithm_ == ExchangeAlgorithm::kSparseAllreduce;
  }
  // Per compressed tensor, the positions the last run() wrote into `buffers`; valid only while
  // `known` (see run(): the next call resets only these).
  struct WrittenPositions {
    std::vector<std::vector<uint64_t>> positions;
    std::vector<std::span<float>> buffers;
    bool known = false;
  };
  // What the last run() measured.
  struct LastRun {
    ExchangeBytes bytes;
    ExchangeTimings timings;
    uint64_t applied = 0;
  };

  comm::Communicator& comm_;
  std::vector<TensorSpec> layout_;
  LayoutIndex index_;
  ExchangeOptions options_;
  ExchangeAlgorithm algorithm_ = ExchangeAlgorithm::kAllgather;
  JobIdentity job_;
  MessageBuffers buffers_;
  SparseAllreduceState sparse_;
  WrittenPositions written_;
  LastRun last_;
  ExchangeBytes total_;
};

}  // namespace dgc
