// A c10::Allocator that wraps LibTorch's default CPU allocator and counts every byte it hands
// out and gets back: exact tensor memory per rank, for tests, benchmarks and the training log.
// Bytes a tensor borrows from shared memory (counted_borrow) count while it holds them.
//
// [Note: the allocator contract]
// ATen and oneDNN use the whole c10::Allocator interface, not only allocate(): oneDNN takes its
// scratch buffers with raw_allocate(), which requires the DataPtr's context to be its data
// pointer and a raw_deleter() that frees from that pointer alone; copy-on-write clones
// (_lazy_clone) wrap only such "simple" DataPtrs. So the size of an allocation cannot live in a
// separate context record: it lives in a header of kHeader bytes just before the data, taken
// from the wrapped allocator's own raw interface. kHeader is the CPU alignment, so the data
// keeps the alignment the wrapped allocator gives. Zero-byte allocations are a null pointer
// (as in the default allocator), and the deleter ignores null.
#include "device/memory_counter.h"

#include <fsdp/memory.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace fsdp {

namespace {

constexpr size_t kHeader = c10::gAlignment;
static_assert(kHeader >= sizeof(size_t), "the header must hold the allocation's size");

std::atomic<int64_t> current_bytes{0};
std::atomic<int64_t> peak_bytes{0};
std::atomic<int64_t> allocation_count{0};
c10::Allocator* wrapped = nullptr;  // the allocator whose raw interface gives the memory

void add_live_bytes(int64_t nbytes) {
  const int64_t now = current_bytes.fetch_add(nbytes) + nbytes;
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

void count(int64_t nbytes) {
  allocation_count.fetch_add(1, std::memory_order_relaxed);
  add_live_bytes(nbytes);
}

void end_borrow(void* nbytes) { current_bytes.fetch_sub(static_cast<int64_t>(reinterpret_cast<uintptr_t>(nbytes))); }

void release(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  size_t nbytes = 0;
  std::memcpy(&nbytes, base, sizeof(nbytes));
  current_bytes.fetch_sub(static_cast<int64_t>(nbytes));
  wrapped->raw_deallocate(base);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device cpu(c10::kCPU);
    if (nbytes == 0) return c10::DataPtr(nullptr, nullptr, &release, cpu);
    auto* base = static_cast<char*>(wrapped->raw_allocate(nbytes + kHeader));
    std::memcpy(base, &nbytes, sizeof(nbytes));
    count(static_cast<int64_t>(nbytes));
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &release, cpu);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

std::once_flag install_once;

}  // namespace

void install_memory_counter() {
  std::call_once(install_once, [] {
    c10::Allocator* inner = c10::GetDefaultCPUAllocator();
    TORCH_CHECK(inner->raw_deleter() != nullptr,
                "fsdp::install_memory_counter: the CPU allocator in place has no raw interface "
                "(raw_deleter()), which the counting allocator builds on; don't install the counter "
                "on top of this allocator");
    wrapped = inner;
    // Never destroyed: tensors may outlive any static destructor order.
    c10::SetCPUAllocator(new CountingAllocator(), /*priority=*/100);
  });
}

bool memory_counter_installed() { return wrapped != nullptr; }

c10::DataPtr counted_borrow(void* bytes, size_t nbytes, c10::Device device) {
  if (!memory_counter_installed() || nbytes == 0) return c10::DataPtr(bytes, device);
  add_live_bytes(static_cast<int64_t>(nbytes));
  // The context is the byte count itself: end_borrow takes it back when the storage drops it.
  return c10::DataPtr(bytes, reinterpret_cast<void*>(static_cast<uintptr_t>(nbytes)), &end_borrow, device);
}

MemoryStats memory_stats() {
  MemoryStats stats;
  stats.current_bytes = current_bytes.load();
  stats.peak_bytes = peak_bytes.load();
  stats.allocations = allocation_count.load();
  return stats;
}

void reset_peak_memory() { peak_bytes.store(current_bytes.load()); }

}  // namespace fsdp
