// The CUDA device ([Note: the device seam]). Each lane has its own stream. A task runs on the
// model's communication thread (which keeps the order of collectives the same on every rank)
// with its lane's stream current, after that stream has waited on an event recorded on the
// compute stream when the task was submitted; an event recorded after the task is what
// CommHandle::wait() makes the compute stream wait on: the host never blocks on the GPU there.
//
// [Note: CUDA memory and streams]
// Unsharded parameters are allocated on the compute stream and written by the all-gather lane;
// the compute stream waits on the lane's event before it reads them and frees them itself, so the
// caching allocator's per-stream reuse is safe. Unsharded gradients are the other way round:
// allocated and freed on the compute stream but read by the reduce lane; their bytes go to
// release_after and are kept until the lane's event has completed (checked at each later task
// and when the device is destroyed), which bounds them to the reductions in flight. No
// recordStream: the allocator would hold such blocks until it next polls its events, which is
// the over-allocation FSDP users report.
#include "device/device.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <deque>
#include <iostream>
#include <vector>

namespace fsdp {

std::unique_ptr<Collectives> make_nccl_collectives(ProcessGroup& group, const c10::Device& device);

namespace {

class CudaDevice final : public DeviceRuntime {
 public:
  explicit CudaDevice(const c10::Device& device) : device_(device) {
    const int count = c10::cuda::device_count();
    TORCH_CHECK(device.has_index() && device.index() < count, "fsdp: ", device.str(), " does not ",
                "exist: this machine has ", count, " CUDA device(s). Put each rank's model on its ",
                "own device, e.g. torch::Device(torch::kCUDA, LOCAL_RANK % device_count)");
    for (auto& stream : streams_) {
      stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
    }
  }

  ~CudaDevice() override {
    thread_.reset();  // runs what is queued, then joins
    for (auto& stream : streams_) stream->synchronize();
    retiring_.clear();
  }

  c10::Device device() const override { return device_; }

  CommHandle submit(CommLane lane, std::function<void()> task, int64_t) override {
    auto ready = std::make_shared<at::cuda::CUDAEvent>();
    ready->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    auto completion = std::make_shared<Completion>(device_.index());
    const c10::cuda::CUDAStream stream = *streams_[static_cast<int>(lane)];
    completion->host = thread_->submit([this, stream, ready, completion, task = std::move(task)] {
      c10::cuda::CUDAStreamGuard guard(stream);
      ready->block(stream);
      retire_completed();
      task();
      completion->done->record(stream);
      if (!pending_.empty()) retiring_.push_back({completion->done, std::move(pending_)});
      pending_.clear();
    });
    return CommHandle(completion);
  }

  std::unique_ptr<Collectives> collectives(ProcessGroup& group) override {
    // NCCL refuses ranks that share a GPU: staged, their collectives run over Gloo through
    // pinned host buffers instead (tests with W ranks on one GPU).
    if (group.settings().cuda_collectives == CudaCollectives::Staged) {
      return make_staged_collectives(make_ring_collectives(group));
    }
    return make_nccl_collectives(group, device_);
  }

  // Runs on the communication thread, inside a task.
  void release_after(CommLane, c10::DataPtr bytes) override { pending_.push_back(std::move(bytes)); }

  // The caching allocator's statistics never see such bytes (nothing lends them on CUDA).
  c10::DataPtr lent_bytes(void* bytes, size_t) override { return c10::DataPtr(bytes, device_); }

 private:
  struct Completion final : CommHandle::Completion {
    explicit Completion(c10::DeviceIndex index) : index(index) {}
    void wait() override {
      host.wait();  // the task has been enqueued (or thrown)
      done->block(c10::cuda::getCurrentCUDAStream(index));
    }
    void wait_host() override {
      host.wait();
      done->synchronize();  // e.g. a gradient shard's copy into pinned host memory has landed
    }
    c10::DeviceIndex index;
    CommHandle host;
    std::shared_ptr<at::cuda::CUDAEvent> done = std::make_shared<at::cuda::CUDAEvent>();
  };

  struct Retiring {
    std::shared_ptr<at::cuda::CUDAEvent> done;
    std::vector<c10::DataPtr> bytes;
  };

  // Frees the bytes of reductions that have completed, oldest first.
  void retire_completed() {
    while (!retiring_.empty() && retiring_.front().done->query()) retiring_.pop_front();
  }

  c10::Device device_;
  std::optional<c10::cuda::CUDAStream> streams_[2];
  std::vector<c10::DataPtr> pending_;  // of the running task; communication thread only
  std::deque<Retiring> retiring_;      // communication thread only
  std::unique_ptr<CommThread> thread_ = std::make_unique<CommThread>();
};

MemoryStats cuda_memory_stats(const c10::Device& device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  // StatType::AGGREGATE, entry 0 in every LibTorch (its namespace moved between versions).
  constexpr size_t aggregate = 0;
  MemoryStats out;
  out.current_bytes = stats.allocated_bytes[aggregate].current;
  out.peak_bytes = stats.allocated_bytes[aggregate].peak;
  out.allocations = stats.allocation[aggregate].allocated;
  out.reserved_bytes = stats.reserved_bytes[aggregate].current;
  return out;
}

// [Note: CUDA's lazy init]
// LibTorch initialises CUDA on first use by a tensor operation, not when a process starts; until
// then the caching allocator knows no device (its device count is 0) and refuses any index:
// getDeviceStats(0) before the first CUDA tensor throws "Invalid device argument". Every entry of
// this file that LibTorch may refuse before that (making the device, reading and resetting the
// allocator's statistics) therefore goes through initialized(), which runs the lazy init first
// (idempotent and cheap once done); nothing outside this file calls the CUDA runtime directly.
c10::Device initialized(const c10::Device& device) {
  at::globalContext().lazyInitDevice(c10::kCUDA);
  // "cuda" without an index: the current device, as LibTorch reads it.
  return device.has_index() ? device : c10::Device(c10::kCUDA, c10::cuda::current_device());
}

}  // namespace

DeviceSupport cuda_device_support() {
  DeviceSupport cuda;
  cuda.type = c10::kCUDA;
  cuda.make = [](const c10::Device& device) { return std::make_unique<CudaDevice>(initialized(device)); };
  cuda.memory_stats = [](const c10::Device& device) { return cuda_memory_stats(initialized(device)); };
  cuda.reset_peak_memory = [](const c10::Device& device) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(initialized(device).index());
  };
  return cuda;
}

}  // namespace fsdp
