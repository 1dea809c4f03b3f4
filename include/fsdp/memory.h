#pragma once
/// Exact tensor memory of this process, counted by a CPU allocator that wraps LibTorch's default.
/// Opt-in: a library should not replace a program's allocator behind its back, so nothing installs
/// it but a call to install_memory_counter() (gpt_train and the tests make it).

#include <c10/core/Device.h>

#include <cstdint>

namespace fsdp {

/// Bytes of CPU tensor memory allocated through LibTorch since the counter was installed (and the
/// shared-memory bytes units compute on while they do: a board of published shards).
struct MemoryStats {
  int64_t current_bytes = 0;  ///< live now
  int64_t peak_bytes = 0;     ///< highest `current_bytes` since the last reset_peak_memory()
  int64_t allocations = 0;    ///< number of allocations so far
  int64_t reserved_bytes = 0;  ///< held by a caching allocator (CUDA), including free blocks
};

/// Installs the counting allocator as LibTorch's CPU allocator (idempotent). Call it first thing
/// in main(): tensors allocated before it are not counted, neither when allocated nor when freed.
/// It costs one 64-byte header per allocation and two atomic additions.
void install_memory_counter();

/// Whether install_memory_counter() has run.
bool memory_counter_installed();

/// The counters now. Zeroes if install_memory_counter() was never called.
MemoryStats memory_stats();

/// Sets the peak to the current value, to measure the peak of the phase that follows.
void reset_peak_memory();

/// The same for `device`: the counter above for the CPU, the caching allocator's statistics
/// (allocated bytes, reserved bytes, peak) for a CUDA device.
MemoryStats memory_stats(const c10::Device& device);
void reset_peak_memory(const c10::Device& device);

}  // namespace fsdp
