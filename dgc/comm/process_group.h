// A Communicator over a libtorch c10d::ProcessGroup: the process group a PyTorch program already
// has (torch.distributed.init_process_group: Gloo, NCCL or MPI), used by the DGC exchange. This is
// how the Python package's DDP hook exchanges over the user's group, and how a C++ program that
// holds a c10d::ProcessGroup can run dgc::train::DistributedOptimizer over it.
//
// The collectives map onto the group's: allgatherv = an allgather of the sizes (one int64 per
// rank), then an allgather of the messages padded to the largest (c10d's allgather needs equal
// sizes); alltoallv = alltoall_base of the sizes, then alltoall_base with exact split sizes;
// allreduce_sum, broadcast and barrier are the group's. Wire bytes are counted with the ring /
// tree estimates of wire_bytes.h (padded sizes for allgatherv).
//
// Buffers: every collective copies its input into tensors on `options.device` (CPU for Gloo and
// MPI groups; the rank's CUDA device for NCCL, which only takes CUDA tensors) and the result back.
// Timeouts: each collective waits at most its timeout for the group's work (Work::wait); the
// group's own timeout (init_process_group(timeout=...)) applies inside the backend as well. An
// error or a timeout throws dgc::CommError / dgc::TimeoutError with the backend's message; after
// that the communicator is unusable (the group usually is too).
// Collective and thread-safety rules: those of Communicator. The group must outlive nothing: the
// communicator holds a reference to it.
#pragma once

#include <memory>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include "dgc/comm/communicator.h"

namespace c10d {
class ProcessGroup;
}

namespace dgc::comm {

struct ProcessGroupOptions {
  // Default timeout of the collectives (Communicator::default_timeout()).
  Timeout timeout = kDefaultTimeout;
  // Where the collectives' tensors live: CPU for Gloo / MPI, cuda:<local rank> for NCCL.
  c10::Device device = c10::Device(c10::kCPU);
};

std::unique_ptr<Communicator> connect_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                    const ProcessGroupOptions& options = {});

}  // namespace dgc::comm
