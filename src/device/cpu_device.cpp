// The CPU device: the model's communication thread runs both lanes in one FIFO (the rings pair
// sends with receives by their order), shared-memory or ring collectives, the counting allocator.
#include "device/device.h"
#include "comm/host_collectives.h"
#include "device/memory_counter.h"

#include <c10/util/Exception.h>

namespace fsdp {

namespace {

// [Note: small collectives inline]
// Handing a collective to the communication thread costs a wake-up of that thread and one of the
// caller when it is done: ~7 us per 64 KB all-gather back to back (collectives_bench: shm 9.2 us
// on the caller's thread, shm_thread 16.5 us), and more inside a step, where both cores run the
// ranks' compute threads and a woken thread waits for a core. Overlap saves at most the
// collective's own time, which for a small one is less than that: a collective whose buffer has
// at most kInlineCollectiveBytes (~30 us through shared memory) runs on the caller's thread when
// nothing is queued ahead of it (WorkerThread::run_or_submit), so the order of collectives on
// every rank is the one they were issued in ([Note: collective order]); larger ones, and small
// ones behind them, still overlap compute. bench/README.md ("The deep configuration") has the
// measurements.
constexpr int64_t kInlineCollectiveBytes = 256 << 10;

class CpuDevice final : public DeviceRuntime {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  CommHandle submit(CommLane, std::function<void()> task, int64_t overlap_bytes) override {
    if (overlap_bytes <= kInlineCollectiveBytes) return thread_.run_or_submit(std::move(task));
    return thread_.submit(std::move(task));
  }

  std::unique_ptr<Collectives> collectives(ProcessGroup& group) override {
    return host_collectives(group);
  }

  // The task ran to completion on this thread: nothing reads the bytes any more.
  void release_after(CommLane, c10::DataPtr) override {}

  c10::DataPtr lent_bytes(void* bytes, size_t nbytes) override {
    return counted_borrow(bytes, nbytes, device());
  }

 private:
  CommThread thread_;
};

}  // namespace

DeviceSupport cpu_device_support() {
  DeviceSupport cpu;
  cpu.type = c10::kCPU;
  cpu.make = [](const c10::Device&) { return std::make_unique<CpuDevice>(); };
  cpu.memory_stats = [](const c10::Device&) { return memory_stats(); };
  cpu.reset_peak_memory = [](const c10::Device&) { reset_peak_memory(); };
  return cpu;
}

}  // namespace fsdp
