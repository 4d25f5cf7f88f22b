// The Open MPI backend. Every collective is the non-blocking MPI call (MPI_Iallgather,
// MPI_Iallgatherv, MPI_Ialltoall, MPI_Ialltoallv, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier)
// polled with MPI_Test until done or until the deadline, when it throws dgc::TimeoutError.
//
// MPI cannot cancel a collective, so after a timeout the request may still touch its buffers:
// every collective works on buffers this file owns (the caller's data is copied in and out; the
// counts and displacements of the v-collectives too), and on a timeout they are parked until the
// process exits. A process that saw a timeout skips
// MPI_Finalize (it would wait for the stalled peer); mpirun then ends the job.
//
// The simulated cluster (dgc/sim, built with SimGrid's smpicxx, which defines DGC_SMPI=1) runs
// this same file with three differences, each marked kSimulated below:
// - every collective is the blocking call (MPI_Allreduce, ...), on the caller's buffers, and
//   wait() returns at once: in a simulation the deadline would be in wall-clock time, not
//   simulated time; SMPI counts the CPU time between MPI calls as the rank's computation, so
//   the polling loop would be charged as compute; and SMPI's non-blocking collectives use
//   direct (linear) algorithms, while its blocking ones choose Open MPI's algorithms (a ring
//   or recursive halving for a large allreduce), which is what the real MPI_Iallreduce runs;
// - the private communicator is made with MPI_Comm_dup (SMPI 3.32 has no MPI_Comm_idup);
// - smpirun sets no Open MPI launch variables: the program calls MPI_Init itself.
// Nothing is ever parked there, since no call can time out.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "dgc/comm/launch.h"
#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

#if defined(DGC_SMPI) && DGC_SMPI
constexpr bool kSimulated = true;
#else
constexpr bool kSimulated = false;
#endif

struct Runtime {
  std::mutex mutex;
  bool initialized_here = false;
  bool failed = false;                        // a collective timed out: requests are still pending
  std::vector<std::shared_ptr<void>> parked;  // buffers of abandoned requests
};

Runtime& runtime() {
  static Runtime* r = new Runtime;  // never destroyed: parked buffers outlive static dtors
  return *r;
}

void finalize_at_exit() {
  Runtime& r = runtime();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || r.failed) return;
  MPI_Finalize();
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

bool launched_by_mpirun() {
  if (kSimulated) return true;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

void ensure_initialized() {
  Runtime& r = runtime();
  std::lock_guard lock(r.mutex);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  if (!launched_by_mpirun()) {
    throw CommError(
        "the MPI backend needs the processes to be started by mpirun (e.g. mpirun -np 4 dgc "
        "...); no Open MPI launch variables (OMPI_COMM_WORLD_SIZE) were found");
  }
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) throw CommError("MPI_Init_thread failed: " + mpi_error(rc));
  r.initialized_here = true;
  std::atexit(finalize_at_exit);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(Timeout default_timeout) : Communicator(default_timeout) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // A private communicator, so that dgc's collectives never match anyone else's; errors on it
    // return codes (turned into CommError) instead of aborting.
    const auto now = Clock::now();
    const Call setup{"communicator set-up", default_timeout, now, now + default_timeout};
    MPI_Request request = MPI_REQUEST_NULL;
    if (kSimulated) {
      check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    } else {
      check(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request), "MPI_Comm_idup");
    }
    wait(request, setup, nullptr);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && failure().empty() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

 protected:
  std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call& call) override {
    auto sizes = std::make_shared<std::vector<uint64_t>>(size_, 0);
    (*sizes)[rank_] = mine;
    MPI_Request request = MPI_REQUEST_NULL;
    check(kSimulated ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes->data(), 1,
                                     MPI_UINT64_T, comm_)
                     : MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes->data(), 1,
                                      MPI_UINT64_T, comm_, &request),
          "MPI_Iallgather");
    wait(request, call, sizes);
    return *sizes;
  }

  void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                          const Call& call) override {
    // The counts and displacements belong to the request as much as the payload (MPI may read
    // them until it completes): all three are parked together on a timeout.
    struct Buffers {
      std::vector<int> counts, displs;
      std::vector<uint8_t> flat;
    };
    auto b = std::make_shared<Buffers>();
    b->counts = int_counts("allgatherv", sizes);
    b->displs = displacements(b->counts);
    if (!kSimulated) b->flat.assign(flat.begin(), flat.end());
    uint8_t* data = kSimulated ? flat.data() : b->flat.data();
    MPI_Request request = MPI_REQUEST_NULL;
    check(kSimulated ? MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, b->counts.data(),
                                      b->displs.data(), MPI_BYTE, comm_)
                     : MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, b->counts.data(),
                                       b->displs.data(), MPI_BYTE, comm_, &request),
          "MPI_Iallgatherv");
    wait(request, call, b);
    if (!kSimulated) std::memcpy(flat.data(), b->flat.data(), flat.size());
  }

  std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t> send, const Call& call) override {
    auto sizes = std::make_shared<std::vector<uint64_t>>(2 * static_cast<size_t>(size_), 0);
    std::copy(send.begin(), send.end(), sizes->begin());
    MPI_Request request = MPI_REQUEST_NULL;
    check(kSimulated ? MPI_Alltoall(sizes->data(), 1, MPI_UINT64_T, sizes->data() + size_, 1,
                                    MPI_UINT64_T, comm_)
                     : MPI_Ialltoall(sizes->data(), 1, MPI_UINT64_T, sizes->data() + size_, 1,
                                     MPI_UINT64_T, comm_, &request),
          "MPI_Ialltoall");
    wait(request, call, sizes);
    return {sizes->begin() + size_, sizes->end()};
  }

  void alltoallv_payload(std::span<const uint8_t> send, std::span<const uint64_t> send_offsets,
                         std::span<const uint64_t> send_sizes, std::span<uint8_t> receive,
                         std::span<const uint64_t> receive_sizes, const Call& call) override {
    struct Buffers {
      std::vector<int> send_counts, send_displs, receive_counts, receive_displs;
      std::vector<uint8_t> send, receive;
    };
    auto b = std::make_shared<Buffers>();
    b->send_counts = int_counts("alltoallv", send_sizes, send_offsets);
    b->send_displs.assign(send_offsets.begin(), send_offsets.end());
    b->receive_counts = int_counts("alltoallv", receive_sizes);
    b->receive_displs = displacements(b->receive_counts);
    // Under SMPI the caller's buffers (as in allgatherv_payload): 256 simulated ranks of a
    // direct exchange would otherwise hold two more copies of every message.
    if (!kSimulated) {
      b->send.assign(send.begin(), send.end());
      b->send.push_back(0);  // never a null buffer
      b->receive.resize(receive.size() + 1);
    }
    const uint8_t* send_data = kSimulated ? send.data() : b->send.data();
    uint8_t* receive_data = kSimulated ? receive.data() : b->receive.data();
    MPI_Request request = MPI_REQUEST_NULL;
    check(kSimulated ? MPI_Alltoallv(send_data, b->send_counts.data(), b->send_displs.data(),
                                     MPI_BYTE, receive_data, b->receive_counts.data(),
                                     b->receive_displs.data(), MPI_BYTE, comm_)
                     : MPI_Ialltoallv(send_data, b->send_counts.data(), b->send_displs.data(),
                                      MPI_BYTE, receive_data, b->receive_counts.data(),
                                      b->receive_displs.data(), MPI_BYTE, comm_, &request),
          "MPI_Ialltoallv");
    wait(request, call, b);
    if (!kSimulated && !receive.empty()) {
      std::memcpy(receive.data(), b->receive.data(), receive.size());
    }
  }

  void allreduce_sum_primitive(std::span<float> values, const Call& call) override {
    DGC_CHECK_LE(values.size(), static_cast<size_t>(INT_MAX), "MPI counts are int");
    // Under SMPI the caller's buffer itself, and as the send buffer too: SMPI copies an
    // MPI_IN_PLACE buffer into a temporary of the full size, per rank (a 100 MB gradient on 256
    // simulated ranks would need 25 GB), while its allreduce algorithms read the send buffer
    // only to copy it into the receive buffer first.
    auto buffer =
        kSimulated ? nullptr : std::make_shared<std::vector<float>>(values.begin(), values.end());
    float* data = kSimulated ? values.data() : buffer->data();
    const int count = static_cast<int>(values.size());
    MPI_Request request = MPI_REQUEST_NULL;
    check(kSimulated
              ? MPI_Allreduce(data, data, count, MPI_FLOAT, MPI_SUM, comm_)
              : MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, comm_, &request),
          "MPI_Iallreduce");
    wait(request, call, buffer);
    if (!kSimulated) std::memcpy(values.data(), buffer->data(), values.size_bytes());
  }

  void broadcast_primitive(std::span<uint8_t> data, int root, const Call& call) override {
    DGC_CHECK_LE(data.size(), static_cast<size_t>(INT_MAX), "MPI counts are int");
    auto buffer = std::make_shared<std::vector<uint8_t>>(data.begin(), data.end());
    MPI_Request request = MPI_REQUEST_NULL;
    const int count = static_cast<int>(buffer->size());
    check(kSimulated ? MPI_Bcast(buffer->data(), count, MPI_BYTE, root, comm_)
                     : MPI_Ibcast(buffer->data(), count, MPI_BYTE, root, comm_, &request),
          "MPI_Ibcast");
    wait(request, call, buffer);
    std::memcpy(data.data(), buffer->data(), data.size());
  }

  void barrier_primitive(const Call& call) override {
    MPI_Request request = MPI_REQUEST_NULL;
    check(kSimulated ? MPI_Barrier(comm_) : MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    wait(request, call, nullptr);
  }

 private:
  // MPI counts and displacements are int: sizes that add up to more are refused, and so are
  // messages placed at `offsets` (when given) that end past INT_MAX.
  std::vector<int> int_counts(const char* op, std::span<const uint64_t> sizes,
                              std::span<const uint64_t> offsets = {}) const {
    if (!offsets.empty()) {
      std::vector<int> counts(sizes.size());
      for (size_t r = 0; r < sizes.size(); ++r) {
        const auto limit = static_cast<uint64_t>(INT_MAX);
        if (sizes[r] > limit || offsets[r] > limit - sizes[r]) {
          throw CommError(detail::concat("mpi ", op, ": the message for rank ", r, " ends past ",
                                         INT_MAX, " bytes (MPI displacements are int)"));
        }
        counts[r] = static_cast<int>(sizes[r]);
      }
      return counts;
    }
    std::vector<int> counts(sizes.size());
    uint64_t total = 0;
    for (size_t r = 0; r < sizes.size(); ++r) {
      if (sizes[r] > static_cast<uint64_t>(INT_MAX) - total) {
        throw CommError(detail::concat("mpi ", op, ": the messages add up to more than ", INT_MAX,
                                       " bytes (MPI counts are int); rank ", r, " announced ",
                                       sizes[r], " bytes"));
      }
      counts[r] = static_cast<int>(sizes[r]);
      total += sizes[r];
    }
    return counts;
  }

  static std::vector<int> displacements(const std::vector<int>& counts) {
    std::vector<int> displs(counts.size(), 0);
    for (size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
    return displs;
  }

  void check(int rc, const char* call) {
    if (rc != MPI_SUCCESS) {
      throw CommError(detail::concat(call, " failed on rank ", rank_, ": ", mpi_error(rc)));
    }
  }

  // Polls `request` until it completes or the call's deadline passes. `keep` holds the
  // request's buffers; on a timeout or error it is parked for the life of the process.
  void wait(MPI_Request& request, const Call& call, std::shared_ptr<void> keep) {
    // A null request is complete (the blocking calls under SMPI leave it null; SMPI's MPI_Test
    // does not report a null request as done).
    if (request == MPI_REQUEST_NULL) return;
    int polls = 0;
    for (;;) {
      int done = 0;
      const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        park(std::move(keep));
        throw CommError(detail::concat("mpi ", call.op, " failed on rank ", rank_, " of ", size_,
                                       ": ", mpi_error(rc)));
      }
      if (done) return;
      if (Clock::now() >= call.deadline) {
        park(std::move(keep));
        const auto elapsed =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - call.start);
        throw TimeoutError(detail::concat("mpi ", call.op, " timed out on rank ", rank_, " of ",
                                          size_, " after ", elapsed.count(), " ms (timeout ",
                                          call.timeout.count(),
                                          " ms): a peer stalled or died (MPI does not say which)"));
      }
      // Spin briefly for latency, then back off so a stalled wait does not burn a core.
      if (++polls > 1000) {
        std::this_thread::sleep_for(std::chrono::microseconds(polls > 5000 ? 1000 : 50));
      }
    }
  }

  void park(std::shared_ptr<void> keep) {
    Runtime& r = runtime();
    std::lock_guard lock(r.mutex);
    r.failed = true;
    if (keep) r.parked.push_back(std::move(keep));
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace

bool have_mpi() { return true; }

std::unique_ptr<Communicator> connect_mpi(Timeout timeout) {
  DGC_CHECK(timeout.count() > 0, "timeout must be positive");
  ensure_initialized();
  return std::make_unique<MpiCommunicator>(timeout);
}

}  // namespace dgc::comm
