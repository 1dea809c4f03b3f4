// The CPU device: the model's communication thread runs both lanes in one FIFO (the rings pair
// sends with receives by their order), shared-memory or ring collectives, the counting allocator.
#include "device.h"
#include "shm_collectives.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace fsdp {

namespace {

// [Note: shared-memory collectives]
// When every rank of a group runs on one host, its collectives go through a shared-memory
// segment (shm_collectives.h): one copy in and one copy (or reduction) out per byte instead of
// the ring's send, receive and extra copies through Gloo's sockets, with results bitwise the
// ring's and the same byte accounting. FSDP_CPU_COLLECTIVES=ring forces the ring (the fallback,
// for groups across hosts and for tests); unset or "shm" picks shared memory where it applies.
// A group whose segment cannot be set up on some rank (/dev/shm full or not shared) falls back
// to the ring on every rank, with a warning. Every rank must see the same setting.
bool shared_memory_wanted() {
  const char* value = std::getenv("FSDP_CPU_COLLECTIVES");
  const std::string choice = value == nullptr ? "" : value;
  TORCH_CHECK(choice.empty() || choice == "shm" || choice == "ring",
              "environment variable FSDP_CPU_COLLECTIVES='", choice,
              "' must be 'shm' (shared memory between ranks on one host, the default) or 'ring' "
              "(Gloo's send/recv, also across hosts)");
  return choice != "ring";
}

std::unique_ptr<Collectives> cpu_collectives(ProcessGroup& group) {
  if (group.size() == 1 || !shared_memory_wanted() || !all_on_one_host(group)) {
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

class CpuDevice final : public Device {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  CommHandle submit(CommLane, std::function<void()> task) override {
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
