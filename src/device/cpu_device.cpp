// The CPU device: the model's communication thread runs both lanes in one FIFO (the rings pair
// sends with receives by their order), shared-memory or ring collectives, the counting allocator.
#include "device/device.h"
#include "comm/shm_collectives.h"

#include <c10/util/Exception.h>

#include <iostream>
#include <string>

namespace fsdp {

namespace {

// [Note: shared-memory collectives]
// When every rank of a group runs on one host, its collectives go through a shared-memory
// segment (shm_collectives.h): one copy in and one copy (or reduction) out per byte instead of
// the ring's send, receive and extra copies through Gloo's sockets, with results bitwise the
// ring's and the same byte accounting. CpuCollectives::Ring (FSDP_CPU_COLLECTIVES=ring) forces
// the ring (the fallback, for groups across hosts and for tests); the default, SharedMemory,
// picks shared memory where it applies. A group whose segment cannot be set up on some rank
// (/dev/shm full or not shared) falls back to the ring on every rank, with a warning. Every rank
// must choose the same (the group's settings, from init_distributed).
std::unique_ptr<Collectives> cpu_collectives(ProcessGroup& group) {
  const bool ring_wanted = group.settings().cpu_collectives == CpuCollectives::Ring;
  if (group.size() == 1 || ring_wanted || !all_on_one_host(group)) {
    return make_ring_collectives(group);
  }
  std::string why_not;
  if (auto shm = make_shm_collectives(group, kShmChunkBytes, &why_not)) return shm;
  if (group.rank() == 0) {
    std::cerr << "fsdp: warning: shared-memory collectives for process group '" << group.name()
              << "' are unavailable (" << why_not << "); using the ring over Gloo" << std::endl;
  }
  return make_ring_collectives(group);
}

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
    return cpu_collectives(group);
  }

  // The task ran to completion on this thread: nothing reads the bytes any more.
  void release_after(CommLane, c10::DataPtr) override {}

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
