#include "dgc/comm/process_group.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "dgc/comm/wire_bytes.h"
#include "dgc/core/error.h"

namespace dgc::comm {
namespace {

// Upper bound on one rank's message: a corrupt size must not become an allocation.
constexpr int64_t kMaxMessageBytes = int64_t{1} << 34;

class ProcessGroupCommunicator final : public Communicator {
 public:
  ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
                           const ProcessGroupOptions& options)
      : group_(std::move(group)), device_(options.device) {
    DGC_CHECK(group_, "the process group is null: call torch.distributed.init_process_group first");
    default_timeout_ = options.timeout;
  }

  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }
  std::string backend() const override { return "c10d:" + group_->getBackendName(); }

  std::vector<std::vector<uint8_t>> allgatherv(std::span<const uint8_t> message,
                                               Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("allgatherv");
    const int n = size();
    if (n == 1) return {std::vector<uint8_t>(message.begin(), message.end())};

    std::vector<int64_t> sizes = allgather_sizes(static_cast<int64_t>(message.size()), timeout);
    const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
    std::vector<std::vector<uint8_t>> out(n);
    if (largest > 0) {
      torch::Tensor mine = torch::zeros({largest}, torch::kUInt8);
      if (!message.empty()) std::memcpy(mine.data_ptr(), message.data(), message.size());
      std::vector<std::vector<torch::Tensor>> outputs(1);
      for (int r = 0; r < n; ++r) outputs[0].push_back(torch::empty({largest}, options()));
      std::vector<torch::Tensor> inputs{mine.to(device_)};
      wait("allgatherv", group_->allgather(outputs, inputs), timeout);
      for (int r = 0; r < n; ++r) {
        const torch::Tensor got = outputs[0][r].cpu();
        const auto* begin = got.data_ptr<uint8_t>();
        out[r].assign(begin, begin + sizes[r]);
      }
      bytes_ +=
          ring_allgatherv_bytes(std::vector<uint64_t>(n, static_cast<uint64_t>(largest)), rank());
    }
    return out;
  }

  std::vector<std::vector<uint8_t>> alltoallv(std::span<const std::span<const uint8_t>> messages,
                                              Timeout timeout) override {
    timeout = effective_timeout(timeout);
    const int n = size();
    DGC_CHECK_EQ(messages.size(), static_cast<size_t>(n), "alltoallv takes one message per rank");
    check_usable("alltoallv");
    if (n == 1) return {std::vector<uint8_t>(messages[0].begin(), messages[0].end())};

    torch::Tensor send_sizes = torch::empty({n}, torch::kInt64);
    int64_t send_total = 0;
    for (int p = 0; p < n; ++p) {
      send_sizes.data_ptr<int64_t>()[p] = static_cast<int64_t>(messages[p].size());
      send_total += static_cast<int64_t>(messages[p].size());
    }
    torch::Tensor receive_sizes_device = torch::empty({n}, options().dtype(torch::kInt64));
    torch::Tensor send_sizes_device = send_sizes.to(device_);
    std::vector<int64_t> equal;
    wait("alltoallv (sizes)",
         group_->alltoall_base(receive_sizes_device, send_sizes_device, equal, equal), timeout);
    const torch::Tensor receive_sizes = receive_sizes_device.cpu();
    std::vector<int64_t> send_counts(n), receive_counts(n);
    int64_t receive_total = 0;
    for (int p = 0; p < n; ++p) {
      send_counts[p] = static_cast<int64_t>(messages[p].size());
      receive_counts[p] = receive_sizes.data_ptr<int64_t>()[p];
      check_size("alltoallv", p, receive_counts[p]);
      receive_total += receive_counts[p];
    }

    torch::Tensor send = torch::empty({send_total}, torch::kUInt8);
    int64_t offset = 0;
    for (int p = 0; p < n; ++p) {
      if (!messages[p].empty()) {
        std::memcpy(send.data_ptr<uint8_t>() + offset, messages[p].data(), messages[p].size());
      }
      offset += static_cast<int64_t>(messages[p].size());
    }
    torch::Tensor receive_device = torch::empty({receive_total}, options());
    torch::Tensor send_device = send.to(device_);
    wait("alltoallv",
         group_->alltoall_base(receive_device, send_device, receive_counts, send_counts), timeout);
    const torch::Tensor receive = receive_device.cpu();

    std::vector<std::vector<uint8_t>> out(n);
    std::vector<uint64_t> sent(n), received(n);
    offset = 0;
    for (int p = 0; p < n; ++p) {
      const auto* begin = receive.data_ptr<uint8_t>() + offset;
      out[p].assign(begin, begin + receive_counts[p]);
      offset += receive_counts[p];
      sent[p] = static_cast<uint64_t>(send_counts[p]);
      received[p] = static_cast<uint64_t>(receive_counts[p]);
    }
    bytes_ += direct_alltoallv_bytes(sent, received, rank());
    return out;
  }

  void allreduce_sum(std::span<float> values, Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("allreduce");
    if (size() == 1 || values.empty()) return;
    torch::Tensor host =
        torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kFloat32);
    std::vector<torch::Tensor> tensors{owned_copy(host)};
    wait("allreduce", group_->allreduce(tensors), timeout);
    host.copy_(tensors[0]);
    bytes_ += ring_allreduce_bytes(values.size_bytes(), size());
  }

  void broadcast(std::span<uint8_t> data, int root, Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("broadcast");
    DGC_CHECK(root >= 0 && root < size(), "broadcast root ", root, " outside [0, ", size(), ")");
    if (size() == 1 || data.empty()) return;
    torch::Tensor host =
        torch::from_blob(data.data(), {static_cast<int64_t>(data.size())}, torch::kUInt8);
    std::vector<torch::Tensor> tensors{owned_copy(host)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    wait("broadcast", group_->broadcast(tensors, opts), timeout);
    host.copy_(tensors[0]);
    bytes_ += tree_broadcast_bytes(data.size(), rank(), root, size());
  }

  void barrier(Timeout timeout) override {
    timeout = effective_timeout(timeout);
    check_usable("barrier");
    if (size() == 1) return;
    wait("barrier", group_->barrier(), timeout);
  }

 private:
  // A copy of the caller's data on the group's device, in memory the tensor owns. A work that
  // fails or times out may still run in the backend's own thread (ProcessGroupGloo's worker) and
  // touch its tensors; they keep what they own alive, but not memory they merely view, and the
  // caller's buffer may be gone by then. The work reads and writes only such copies.
  torch::Tensor owned_copy(const torch::Tensor& caller) const {
    return caller.to(device_, /*non_blocking=*/false, /*copy=*/true);
  }

  torch::TensorOptions options() const {
    return torch::TensorOptions(torch::kUInt8).device(device_);
  }

  std::vector<int64_t> allgather_sizes(int64_t mine, Timeout timeout) {
    const int n = size();
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < n; ++r)
      outputs[0].push_back(torch::empty({1}, options().dtype(torch::kInt64)));
    std::vector<torch::Tensor> inputs{torch::full({1}, mine, torch::kInt64).to(device_)};
    wait("allgatherv (sizes)", group_->allgather(outputs, inputs), timeout);
    bytes_ += ring_allgatherv_bytes(std::vector<uint64_t>(n, sizeof(int64_t)), rank());
    std::vector<int64_t> sizes(n);
    for (int r = 0; r < n; ++r) {
      sizes[r] = outputs[0][r].cpu().data_ptr<int64_t>()[0];
      check_size("allgatherv", r, sizes[r]);
    }
    return sizes;
  }

  void check_size(const char* what, int peer, int64_t bytes) {
    if (bytes < 0 || bytes > kMaxMessageBytes) {
      broken_ = true;
      throw CommError(detail::concat(what, ": rank ", peer, " announced a message of ", bytes,
                                     " bytes, outside [0, ", kMaxMessageBytes,
                                     "] (corrupt or mismatched peer)"));
    }
  }

  void check_usable(const char* what) const {
    if (broken_) {
      throw CommError(detail::concat(what, ": this communicator failed earlier and is unusable; ",
                                     "destroy the process group and start again"));
    }
  }

  // Waits for `work`; any failure becomes a CommError (TimeoutError when it timed out).
  void wait(const char* what, const c10::intrusive_ptr<c10d::Work>& work, Timeout timeout) {
    std::string message;
    try {
      work->wait(timeout);
      return;
    } catch (const std::exception& e) {
      message = e.what();
    }
    broken_ = true;
    const std::string text =
        detail::concat(what, " over the ", group_->getBackendName(), " process group (rank ",
                       rank(), " of ", size(), ") failed: ", message);
    std::string lower = message;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower.find("timed out") != std::string::npos ||
        lower.find("timeout") != std::string::npos) {
      throw TimeoutError(text + " (timeout " + std::to_string(timeout.count()) + " ms)");
    }
    throw CommError(text);
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::Device device_;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Communicator> connect_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                    const ProcessGroupOptions& options) {
  return std::make_unique<ProcessGroupCommunicator>(std::move(group), options);
}

}  // namespace dgc::comm
