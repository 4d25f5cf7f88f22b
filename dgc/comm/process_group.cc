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

class ProcessGroupCommunicator final : public Communicator {
 public:
  ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
                           const ProcessGroupOptions& options)
      : Communicator(options.timeout), group_(std::move(group)), device_(options.device) {
    DGC_CHECK(group_, "the process group is null: call torch.distributed.init_process_group first");
  }

  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }
  std::string backend() const override { return "c10d:" + group_->getBackendName(); }

 protected:
  std::vector<uint64_t> allgather_sizes(uint64_t mine, const Call& call) override {
    const int n = size();
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < n; ++r) {
      outputs[0].push_back(torch::empty({1}, options().dtype(torch::kInt64)));
    }
    std::vector<torch::Tensor> inputs{
        torch::full({1}, static_cast<int64_t>(mine), torch::kInt64).to(device_)};
    wait(call, group_->allgather(outputs, inputs));
    std::vector<uint64_t> sizes(n);
    for (int r = 0; r < n; ++r) {
      // A negative size becomes one over kMaxMessageBytes, which the base refuses.
      sizes[r] = static_cast<uint64_t>(outputs[0][r].cpu().data_ptr<int64_t>()[0]);
    }
    return sizes;
  }

  // c10d has no variable-size allgather: every message travels padded to the largest.
  void allgatherv_payload(std::span<uint8_t> flat, std::span<const uint64_t> sizes,
                          const Call& call) override {
    const int n = size();
    const auto largest = static_cast<int64_t>(*std::max_element(sizes.begin(), sizes.end()));
    const std::vector<size_t> offsets = offsets_of(sizes);
    torch::Tensor mine = torch::zeros({largest}, torch::kUInt8);
    if (sizes[rank()] > 0) {
      std::memcpy(mine.data_ptr(), flat.data() + offsets[rank()], sizes[rank()]);
    }
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < n; ++r) outputs[0].push_back(torch::empty({largest}, options()));
    std::vector<torch::Tensor> inputs{mine.to(device_)};
    wait(call, group_->allgather(outputs, inputs));
    for (int r = 0; r < n; ++r) {
      if (r == rank() || sizes[r] == 0) continue;
      const torch::Tensor got = outputs[0][r].cpu();
      std::memcpy(flat.data() + offsets[r], got.data_ptr<uint8_t>(), sizes[r]);
    }
  }

  ByteCounters allgatherv_payload_bytes(std::span<const uint64_t> sizes) const override {
    const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
    return ring_allgatherv_bytes(std::vector<uint64_t>(sizes.size(), largest), rank());
  }

  std::vector<uint64_t> alltoall_sizes(std::span<const uint64_t> send, const Call& call) override {
    const int n = size();
    torch::Tensor send_sizes = torch::empty({n}, torch::kInt64);
    for (int p = 0; p < n; ++p) send_sizes.data_ptr<int64_t>()[p] = static_cast<int64_t>(send[p]);
    torch::Tensor receive_device = torch::empty({n}, options().dtype(torch::kInt64));
    torch::Tensor send_device = send_sizes.to(device_);
    std::vector<int64_t> equal;
    wait(call, group_->alltoall_base(receive_device, send_device, equal, equal));
    const torch::Tensor received = receive_device.cpu();
    std::vector<uint64_t> sizes(n);
    for (int p = 0; p < n; ++p) sizes[p] = static_cast<uint64_t>(received.data_ptr<int64_t>()[p]);
    return sizes;
  }

  void alltoallv_payload(std::span<const uint8_t> all_send, std::span<const uint64_t> send_offsets,
                         std::span<const uint64_t> send_sizes, std::span<uint8_t> receive,
                         std::span<const uint64_t> receive_sizes, const Call& call) override {
    std::vector<uint8_t> storage;  // alltoall_base takes the messages back to back only
    const auto send = packed(all_send, send_offsets, send_sizes, storage);
    torch::Tensor send_host = torch::empty({static_cast<int64_t>(send.size())}, torch::kUInt8);
    if (!send.empty()) std::memcpy(send_host.data_ptr(), send.data(), send.size());
    torch::Tensor receive_device = torch::empty({static_cast<int64_t>(receive.size())}, options());
    torch::Tensor send_device = send_host.to(device_);
    std::vector<int64_t> send_counts(send_sizes.begin(), send_sizes.end());
    std::vector<int64_t> receive_counts(receive_sizes.begin(), receive_sizes.end());
    wait(call, group_->alltoall_base(receive_device, send_device, receive_counts, send_counts));
    if (!receive.empty()) {
      std::memcpy(receive.data(), receive_device.cpu().data_ptr(), receive.size());
    }
  }

  void allreduce_sum_primitive(std::span<float> values, const Call& call) override {
    torch::Tensor host =
        torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kFloat32);
    std::vector<torch::Tensor> tensors{owned_copy(host)};
    wait(call, group_->allreduce(tensors));
    host.copy_(tensors[0]);
  }

  void broadcast_primitive(std::span<uint8_t> data, int root, const Call& call) override {
    torch::Tensor host =
        torch::from_blob(data.data(), {static_cast<int64_t>(data.size())}, torch::kUInt8);
    std::vector<torch::Tensor> tensors{owned_copy(host)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    wait(call, group_->broadcast(tensors, opts));
    host.copy_(tensors[0]);
  }

  void barrier_primitive(const Call& call) override { wait(call, group_->barrier()); }

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

  // Waits for `work` until the call's deadline; any failure becomes a CommError (TimeoutError
  // when it timed out).
  void wait(const Call& call, const c10::intrusive_ptr<c10d::Work>& work) {
    std::string message;
    try {
      work->wait(call.remaining());
      return;
    } catch (const std::exception& e) {
      message = e.what();
    }
    const std::string text =
        detail::concat(call.op, " over the ", group_->getBackendName(), " process group (rank ",
                       rank(), " of ", size(), ") failed: ", message);
    std::string lower = message;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower.find("timed out") != std::string::npos ||
        lower.find("timeout") != std::string::npos) {
      throw TimeoutError(text + " (timeout " + std::to_string(call.timeout.count()) + " ms)");
    }
    throw CommError(text);
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::Device device_;
};

}  // namespace

std::unique_ptr<Communicator> connect_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                    const ProcessGroupOptions& options) {
  return std::make_unique<ProcessGroupCommunicator>(std::move(group), options);
}

}  // namespace dgc::comm
