// Collectives over NCCL (c10d::ProcessGroupNCCL) for CUDA tensors: its own all-gather into one
// tensor and reduce-scatter out of one, no rings. Called with the lane's stream current
// (cuda_device.cpp): Work::wait() makes that stream wait for NCCL's, the host does not block.
#include "comm/collectives.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace fsdp {

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// [Note: NCCL without recordStream]
// By default ProcessGroupNCCL calls recordStream on a collective's tensors, so that the caching
// allocator keeps their blocks until its NCCL stream is done with them: it then holds such blocks
// until it next polls its events, the over-allocation [Note: CUDA memory and streams] avoids.
// Without recordStream it keeps references to the tensors until the work is waited on, which
// run() does at once (the lane's stream then waits on NCCL's), and release_after keeps the bytes
// of the gradients until the lane's event has completed. The switch is no field of
// ProcessGroupNCCL::Options: its constructor reads TORCH_NCCL_AVOID_RECORD_STREAMS into a
// protected member, which this subclass sets, leaving the process's environment alone.
class NcclBackendWithoutRecordStream final : public c10d::ProcessGroupNCCL {
 public:
  NcclBackendWithoutRecordStream(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 c10::intrusive_ptr<Options> options)
      : ProcessGroupNCCL(store, rank, size, std::move(options)) {
    avoidRecordStreams_ = true;
  }
};

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(ProcessGroup& group, const c10::Device& device) : group_(group), device_(device) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = group.timeout();
    // The group's own store (it outlives this object), under a fresh prefix: every sharded
    // model over the group makes its own NCCL communicator (same sequence on every rank).
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        group.next_store_key("nccl"),
        c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(&group.store()));
    backend_ = c10::make_intrusive<NcclBackendWithoutRecordStream>(store, group.rank(), group.size(),
                                                                   options);
  }

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

  void all_gather(const at::Tensor& full, const at::Tensor& shard) override {
    if (size() == 1) {
      if (!shard.is_same(full)) full.copy_(shard);
      return;
    }
    at::Tensor out = full, in = shard;
    run("all-gather", [&] { return backend_->_allgather_base(out, in); });
    count_sent_bytes(CollectiveKind::AllGather, (size() - 1) * nbytes(shard));
  }

  void reduce_scatter_sum(const at::Tensor& shard, const at::Tensor& full) override {
    if (size() == 1) {
      if (!shard.is_same(full)) shard.copy_(full);
      return;
    }
    at::Tensor out = shard, in = full;
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    run("reduce-scatter", [&] { return backend_->_reduce_scatter_base(out, in, options); });
    count_sent_bytes(CollectiveKind::ReduceScatter, (size() - 1) * nbytes(shard));
  }

  void all_reduce_sum(const at::Tensor& t) override {
    if (size() == 1) return;
    std::vector<at::Tensor> tensors{t};
    run("all-reduce", [&] { return backend_->allreduce(tensors); });
    count_sent_bytes(CollectiveKind::AllReduce, 2 * (size() - 1) * nbytes(t) / size());
  }

  void broadcast(const at::Tensor& t, int root) override {
    if (size() == 1) return;
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run("broadcast", [&] { return backend_->broadcast(tensors, options); });
    if (rank() == root) count_sent_bytes(CollectiveKind::Broadcast, (size() - 1) * nbytes(t));
  }

  void all_to_all(const at::Tensor& received, const at::Tensor& send, const std::vector<int64_t>& send_numels,
                  const std::vector<int64_t>& receive_numels) override {
    check_all_to_all(size(), received, send, send_numels, receive_numels);
    if (size() == 1) {
      received.copy_(send);
      return;
    }
    at::Tensor out = received, in = send.contiguous();
    std::vector<int64_t> receive_counts = receive_numels, send_counts = send_numels;
    run("all-to-all", [&] { return backend_->alltoall_base(out, in, receive_counts, send_counts); });
    count_all_to_all_bytes(rank(), send, send_numels);
  }

 private:
  // wait() without a timeout only orders the current (lane) stream after NCCL's: the host goes
  // on. A collective that never completes is ProcessGroupNCCL's watchdog's to end (after
  // Options::timeout, the group's), which then fails the process with NCCL's error.
  template <class Issue>
  void run(const char* what, Issue&& issue) {
    try {
      issue()->wait();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fsdp: NCCL ", what, " on rank ", rank(), " of process group '",
                  group_.name(), "' (", device_.str(), ") failed: ", e.what(),
                  "\nA peer rank has probably died or stalled; its own log names the cause. Two "
                  "ranks on one GPU need FSDP_CUDA_COLLECTIVES=staged.");
    }
  }

  ProcessGroup& group_;
  c10::Device device_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> backend_;
};

}  // namespace

std::unique_ptr<Collectives> make_nccl_collectives(ProcessGroup& group, const c10::Device& device) {
  return std::make_unique<NcclCollectives>(group, device);
}

}  // namespace fsdp
