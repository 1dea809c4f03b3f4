#include "device/device.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp {

namespace {

const DeviceSupport& support_for(const c10::Device& device) {
  static const std::vector<DeviceSupport> devices = builtin_devices();
  auto it = std::find_if(devices.begin(), devices.end(),
                         [&](const DeviceSupport& support) { return support.type == device.type(); });
  TORCH_CHECK(it != devices.end(), "fsdp: ", device.str(),
              " is not supported by this build of fsdp-cpp, which supports ",
              device.is_cuda() ? "no CUDA: build it against a CUDA LibTorch (scripts/build_cuda.sh "
                                 "shows how; CMake then turns FSDP_CUDA on)"
                               : "cpu and (built against a CUDA LibTorch) cuda devices",
              ". Move the model to a supported device before fully_shard.");
  return *it;
}

}  // namespace

std::unique_ptr<DeviceRuntime> make_device(const c10::Device& device) {
  return support_for(device).make(device);
}

MemoryStats memory_stats(const c10::Device& device) { return support_for(device).memory_stats(device); }

void reset_peak_memory(const c10::Device& device) { support_for(device).reset_peak_memory(device); }

}  // namespace fsdp
