#pragma once
// [Note: the device seam]
// FSDP works the same on every device but for four things, which a DeviceRuntime provides:
//  - where a unit's communication runs (submit): on CPU the model's communication thread; on
//    CUDA its lane's own stream, ordered after the compute stream's work so far by an event, and
//    the compute stream waits on the lane's event only when CommHandle::wait() says it needs the
//    data;
//  - the collectives (rings over Gloo's send/recv on CPU; NCCL's own on CUDA);
//  - the memory in use (the counting allocator on CPU; the caching allocator's statistics),
//    including bytes a tensor uses without owning them (lent_bytes);
//  - when the bytes a collective read may be reused (release_after): at once on CPU; on CUDA
//    once the lane's work has completed, so that the caching allocator cannot hand them to the
//    compute stream while a collective still reads them (without recordStream, which over-holds
//    memory until the allocator next looks).
// The policy of a unit's communication (copy-in, casts, divisors, reductions, accumulation:
// unit_comm.h) and the state machine (ParamGroup) are shared. A device is a file with a function
// <name>_device_support() returning its DeviceSupport, named in FSDP_DEVICES in
// src/CMakeLists.txt, which generates builtin_devices() calling every such function: the set of
// devices is fixed when the library is built, so it is a constant table rather than a registry
// filled at run time (a static initializer would be dropped by the linker from a static library).

#include "comm/collectives.h"
#include "comm/comm_thread.h"

#include <fsdp/memory.h>

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace fsdp {

/// The two streams of work a unit's communication runs on; their order within a lane is the
/// order of submission on every rank ([Note: collective order]).
enum class CommLane { AllGather, Reduce };

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual c10::Device device() const = 0;
  /// Runs `task` (a unit's communication work) off the compute path, after the compute work
  /// issued so far; wait() on the handle orders the caller after it. `overlap_bytes`: how many
  /// bytes its collective moves while the caller computes (its full buffer; 0 when the caller
  /// waits at once): the CPU device runs a task with few on the caller's thread ([Note: small
  /// collectives inline] in cpu_device.cpp).
  virtual CommHandle submit(CommLane lane, std::function<void()> task, int64_t overlap_bytes) = 0;
  /// Collectives over `group` for tensors on this device.
  virtual std::unique_ptr<Collectives> collectives(ProcessGroup& group) = 0;
  /// Called from inside a task of `lane`: frees `bytes` once that task's work has completed.
  virtual void release_after(CommLane lane, c10::DataPtr bytes) = 0;
  /// A tensor's storage pointer to `nbytes` at `bytes`, which this process does not own and
  /// never frees (memory the ranks share): the memory in use counts them while a tensor holds
  /// them, as if it had allocated them.
  virtual c10::DataPtr lent_bytes(void* bytes, size_t nbytes) = 0;
};

/// What a device type provides: its DeviceRuntime, and its memory statistics (fsdp/memory.h).
struct DeviceSupport {
  c10::DeviceType type;
  std::function<std::unique_ptr<DeviceRuntime>(const c10::Device&)> make;
  std::function<MemoryStats(const c10::Device&)> memory_stats;
  std::function<void(const c10::Device&)> reset_peak_memory;
};

/// The devices this build has (generated from FSDP_DEVICES).
std::vector<DeviceSupport> builtin_devices();

/// The DeviceRuntime for `device`; an error naming the fix when this build does not support it.
std::unique_ptr<DeviceRuntime> make_device(const c10::Device& device);

}  // namespace fsdp
