// The CPU device: the model's communication thread runs both lanes in one FIFO (the rings pair
// sends with receives by their order), ring collectives over Gloo, the counting allocator.
#include "device.h"

namespace fsdp {

namespace {

class CpuDevice final : public Device {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  CommHandle submit(CommLane, std::function<void()> task) override {
    return thread_.submit(std::move(task));
  }

  std::unique_ptr<Collectives> collectives(ProcessGroup& group) override {
    return make_ring_collectives(group);
  }

  // The task ran to completion on this thread: nothing reads the bytes any more.
  void release_after(CommLane, c10::DataPtr) override {}

 private:
  CommThread thread_;
};

}  // namespace

void register_cpu_device() {
  DeviceSupport cpu;
  cpu.make = [](const c10::Device&) { return std::make_unique<CpuDevice>(); };
  cpu.memory_stats = [](const c10::Device&) { return memory_stats(); };
  cpu.reset_peak_memory = [](const c10::Device&) { reset_peak_memory(); };
  register_device(c10::kCPU, std::move(cpu));
}

}  // namespace fsdp
