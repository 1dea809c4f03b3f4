#pragma once
/// Exact tensor memory of this process, counted by a CPU allocator that wraps LibTorch's default.

#include <cstdint>

namespace fsdp {

/// Bytes of CPU tensor memory allocated through LibTorch since the counter was installed.
struct MemoryStats {
  int64_t current_bytes = 0;  ///< live now
  int64_t peak_bytes = 0;     ///< highest `current_bytes` since the last reset_peak_memory()
  int64_t allocations = 0;    ///< number of allocations so far
};

/// Installs the counting allocator (idempotent; init_distributed() calls it). Tensors allocated
/// before it was installed are not counted, neither when allocated nor when freed.
void install_memory_counter();

/// The counters now. Zeroes if install_memory_counter() was never called.
MemoryStats memory_stats();

/// Sets the peak to the current value, to measure the peak of the phase that follows.
void reset_peak_memory();

}  // namespace fsdp
