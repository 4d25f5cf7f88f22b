// The Open MPI backend. Every collective is the non-blocking MPI call (MPI_Iallgather,
// MPI_Iallgatherv, MPI_Ialltoall, MPI_Ialltoallv, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier)
// polled with MPI_Test until done or until the deadline, when it throws dgc::TimeoutError.
//
// MPI cannot cancel a collective, so after a timeout the request may still touch its buffers:
// every collective works on buffers this file owns (the caller's data is copied in and out; the
// counts and displacements of the v-collectives too), and on a timeout they are parked until the
// process exits. A process that saw a timeout skips
// MPI_Finalize (it would wait for the stalled peer); mpirun then ends the job.
#include <mpi.h>

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

using Clock = std::chrono::steady_clock;

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
  explicit MpiCommunicator(Timeout default_timeout) {
    default_timeout_ = default_timeout;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // A private communicator, so that dgc's collectives never match anyone else's; errors on it
    // return codes (turned into CommError) instead of aborting.
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request), "MPI_Comm_idup");
    wait(request, "communicator set-up", default_timeout_, Clock::now(), nullptr);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && failure_.empty() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::vector<std::vector<uint8_t>> allgatherv(std::span<const uint8_t> message,
                                               Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("allgatherv");
    const auto start = Clock::now();
    const int n = size_;
    if (n == 1) return {std::vector<uint8_t>(message.begin(), message.end())};

    auto sizes = std::make_shared<std::vector<uint64_t>>(n, 0);
    (*sizes)[rank_] = message.size();
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes->data(), 1, MPI_UINT64_T, comm_,
                         &request),
          "MPI_Iallgather");
    wait(request, "allgatherv (sizes)", timeout, start, sizes);
    bytes_ += ring_allgatherv_bytes(std::vector<uint64_t>(n, sizeof(uint64_t)), rank_);

    // The counts and displacements belong to the request as much as the payload (MPI may read
    // them until it completes): all three are parked together on a timeout.
    struct Buffers {
      std::vector<int> counts, displs;
      std::vector<uint8_t> flat;
    };
    auto b = std::make_shared<Buffers>();
    b->counts.resize(n);
    b->displs.resize(n);
    uint64_t total = 0;
    for (int r = 0; r < n; ++r) {
      if ((*sizes)[r] > static_cast<uint64_t>(INT_MAX) - total) {
        fail<CommError>(detail::concat("mpi allgatherv: the messages add up to more than ", INT_MAX,
                                       " bytes (MPI counts are int); rank ", r, " announced ",
                                       (*sizes)[r], " bytes"));
      }
      b->displs[r] = static_cast<int>(total);
      b->counts[r] = static_cast<int>((*sizes)[r]);
      total += (*sizes)[r];
    }
    b->flat.resize(total);
    if (!message.empty()) {
      std::memcpy(b->flat.data() + b->displs[rank_], message.data(), message.size());
    }
    if (total > 0) {
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->flat.data(), b->counts.data(),
                            b->displs.data(), MPI_BYTE, comm_, &request),
            "MPI_Iallgatherv");
      wait(request, "allgatherv", timeout, start, b);
      bytes_ += ring_allgatherv_bytes(*sizes, rank_);
    }
    std::vector<std::vector<uint8_t>> out(n);
    for (int r = 0; r < n; ++r) {
      const auto* begin = b->flat.data() + b->displs[r];
      out[r].assign(begin, begin + b->counts[r]);
    }
    return out;
  }

  std::vector<std::vector<uint8_t>> alltoallv(std::span<const std::span<const uint8_t>> messages,
                                              Timeout timeout) override {
    timeout = effective_timeout(timeout);
    const int n = size_;
    DGC_CHECK_EQ(messages.size(), static_cast<size_t>(n), "alltoallv takes one message per rank");
    check_usable("alltoallv");
    const auto start = Clock::now();
    if (n == 1) return {std::vector<uint8_t>(messages[0].begin(), messages[0].end())};

    // Sizes first, then the payloads (MPI_Ialltoallv: every pair at once).
    auto sizes = std::make_shared<std::vector<uint64_t>>(2 * static_cast<size_t>(n), 0);
    uint64_t* send_sizes = sizes->data();
    uint64_t* receive_sizes = sizes->data() + n;
    for (int p = 0; p < n; ++p) send_sizes[p] = messages[p].size();
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoall(send_sizes, 1, MPI_UINT64_T, receive_sizes, 1, MPI_UINT64_T, comm_,
                        &request),
          "MPI_Ialltoall");
    wait(request, "alltoallv (sizes)", timeout, start, sizes);

    struct Buffers {
      std::vector<int> send_counts, send_displs, receive_counts, receive_displs;
      std::vector<uint8_t> send, receive;
    };
    auto b = std::make_shared<Buffers>();
    b->send_counts.resize(n);
    b->send_displs.resize(n);
    b->receive_counts.resize(n);
    b->receive_displs.resize(n);
    uint64_t send_total = 0, receive_total = 0;
    for (int p = 0; p < n; ++p) {
      if (send_sizes[p] > static_cast<uint64_t>(INT_MAX) - send_total ||
          receive_sizes[p] > static_cast<uint64_t>(INT_MAX) - receive_total) {
        fail<CommError>(detail::concat("mpi alltoallv: the messages add up to more than ", INT_MAX,
                                       " bytes (MPI counts are int); rank ", p, " announced ",
                                       receive_sizes[p], " bytes"));
      }
      b->send_displs[p] = static_cast<int>(send_total);
      b->send_counts[p] = static_cast<int>(send_sizes[p]);
      b->receive_displs[p] = static_cast<int>(receive_total);
      b->receive_counts[p] = static_cast<int>(receive_sizes[p]);
      send_total += send_sizes[p];
      receive_total += receive_sizes[p];
    }
    b->send.resize(send_total + 1);  // + 1: never a null buffer
    b->receive.resize(receive_total + 1);
    for (int p = 0; p < n; ++p) {
      if (!messages[p].empty()) {
        std::memcpy(b->send.data() + b->send_displs[p], messages[p].data(), messages[p].size());
      }
    }
    check(MPI_Ialltoallv(b->send.data(), b->send_counts.data(), b->send_displs.data(), MPI_BYTE,
                         b->receive.data(), b->receive_counts.data(), b->receive_displs.data(),
                         MPI_BYTE, comm_, &request),
          "MPI_Ialltoallv");
    wait(request, "alltoallv", timeout, start, b);
    bytes_ += direct_alltoallv_bytes(std::span<const uint64_t>(send_sizes, n),
                                     std::span<const uint64_t>(receive_sizes, n), rank_);
    std::vector<std::vector<uint8_t>> out(n);
    for (int p = 0; p < n; ++p) {
      const auto* begin = b->receive.data() + b->receive_displs[p];
      out[p].assign(begin, begin + b->receive_counts[p]);
    }
    return out;
  }

  void allreduce_sum(std::span<float> values, Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("allreduce");
    if (size_ == 1 || values.empty()) return;
    DGC_CHECK_LE(values.size(), static_cast<size_t>(INT_MAX), "MPI counts are int");
    const auto start = Clock::now();
    auto buffer = std::make_shared<std::vector<float>>(values.begin(), values.end());
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, buffer->data(), static_cast<int>(buffer->size()), MPI_FLOAT,
                         MPI_SUM, comm_, &request),
          "MPI_Iallreduce");
    wait(request, "allreduce", timeout, start, buffer);
    std::memcpy(values.data(), buffer->data(), values.size_bytes());
    bytes_ += ring_allreduce_bytes(values.size_bytes(), size_);
  }

  void broadcast(std::span<uint8_t> data, int root, Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("broadcast");
    DGC_CHECK(root >= 0 && root < size_, "broadcast root ", root, " outside [0, ", size_, ")");
    if (size_ == 1 || data.empty()) return;
    DGC_CHECK_LE(data.size(), static_cast<size_t>(INT_MAX), "MPI counts are int");
    const auto start = Clock::now();
    auto buffer = std::make_shared<std::vector<uint8_t>>(data.begin(), data.end());
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(buffer->data(), static_cast<int>(buffer->size()), MPI_BYTE, root, comm_,
                     &request),
          "MPI_Ibcast");
    wait(request, "broadcast", timeout, start, buffer);
    std::memcpy(data.data(), buffer->data(), data.size());
    bytes_ += tree_broadcast_bytes(data.size(), rank_, root, size_);
  }

  void barrier(Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("barrier");
    if (size_ == 1) return;
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    wait(request, "barrier", timeout, Clock::now(), nullptr);
  }

 private:
  void check_usable(const char* op) const {
    if (!failure_.empty()) {
      throw CommError(
          detail::concat("mpi ", op, " on rank ", rank_,
                         ": the communicator is unusable after an earlier error: ", failure_));
    }
  }

  void check(int rc, const char* call) {
    if (rc != MPI_SUCCESS) {
      fail<CommError>(detail::concat(call, " failed on rank ", rank_, ": ", mpi_error(rc)));
    }
  }

  // Polls `request` until it completes or `timeout` after `start` has passed. `keep` holds the
  // request's buffers; on a timeout it is parked for the life of the process.
  void wait(MPI_Request& request, const char* op, Timeout timeout, Clock::time_point start,
            std::shared_ptr<void> keep) {
    const auto deadline = start + timeout;
    int polls = 0;
    for (;;) {
      int done = 0;
      const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        park(std::move(keep));
        fail<CommError>(detail::concat("mpi ", op, " failed on rank ", rank_, " of ", size_, ": ",
                                       mpi_error(rc)));
      }
      if (done) return;
      if (Clock::now() >= deadline) {
        park(std::move(keep));
        const auto elapsed =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        fail<TimeoutError>(detail::concat("mpi ", op, " timed out on rank ", rank_, " of ", size_,
                                          " after ", elapsed.count(), " ms (timeout ",
                                          timeout.count(),
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

  template <typename E>
  [[noreturn]] void fail(const std::string& what) {
    failure_ = what;
    throw E(what);
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string failure_;
};

}  // namespace

bool have_mpi() { return true; }

std::unique_ptr<Communicator> connect_mpi(Timeout timeout) {
  DGC_CHECK(timeout.count() > 0, "timeout must be positive");
  ensure_initialized();
  return std::make_unique<MpiCommunicator>(timeout);
}

}  // namespace dgc::comm
