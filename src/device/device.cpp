#include "device/device.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>

namespace fsdp {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<c10::DeviceType, DeviceSupport> devices;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

const DeviceSupport& support_for(const c10::Device& device) {
  static std::once_flag builtin;
  std::call_once(builtin, register_builtin_devices);
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().devices.find(device.type());
  TORCH_CHECK(it != registry().devices.end(), "fsdp: ", device.str(),
              " is not supported by this build of fsdp-cpp, which supports ",
              device.is_cuda() ? "no CUDA: build it against a CUDA LibTorch (scripts/build_cuda.sh "
                                 "shows how; CMake then turns FSDP_CUDA on)"
                               : "cpu and (built against a CUDA LibTorch) cuda devices",
              ". Move the model to a supported device before fully_shard.");
  return it->second;  // entries are never removed
}

}  // namespace

void register_device(c10::DeviceType type, DeviceSupport support) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().devices[type] = std::move(support);
}

std::unique_ptr<Device> make_device(const c10::Device& device) {
  return support_for(device).make(device);
}

MemoryStats memory_stats(const c10::Device& device) { return support_for(device).memory_stats(device); }

void reset_peak_memory(const c10::Device& device) { support_for(device).reset_peak_memory(device); }

}  // namespace fsdp
