// A c10::Allocator that wraps LibTorch's default CPU allocator and counts every byte it hands
// out and gets back: exact tensor memory per rank, for tests, benchmarks and the training log.
#include <fsdp/memory.h>

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>

namespace fsdp {

namespace {

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr inner = inner_->allocate(nbytes);
    void* data = inner.get();
    auto* record = new Record{std::move(inner), nbytes, this};
    add(static_cast<int64_t>(nbytes));
    return c10::DataPtr(data, record, &CountingAllocator::release, c10::Device(c10::kCPU));
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  MemoryStats stats() const {
    MemoryStats s;
    s.current_bytes = current_.load();
    s.peak_bytes = peak_.load();
    s.allocations = allocations_.load();
    return s;
  }

  void reset_peak() { peak_.store(current_.load()); }

 private:
  struct Record {
    c10::DataPtr inner;  // frees through the wrapped allocator when the record is deleted
    size_t nbytes;
    CountingAllocator* owner;
  };

  static void release(void* context) {
    auto* record = static_cast<Record*>(context);
    record->owner->current_.fetch_sub(static_cast<int64_t>(record->nbytes));
    delete record;
  }

  void add(int64_t nbytes) {
    allocations_.fetch_add(1);
    int64_t now = current_.fetch_add(nbytes) + nbytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }

  c10::Allocator* inner_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

CountingAllocator* installed = nullptr;
std::once_flag install_once;

}  // namespace

void install_memory_counter() {
  std::call_once(install_once, [] {
    // Never destroyed: tensors may outlive any static destructor order.
    installed = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(installed, /*priority=*/100);
  });
}

MemoryStats memory_stats() { return installed ? installed->stats() : MemoryStats{}; }

void reset_peak_memory() {
  if (installed) installed->reset_peak();
}

}  // namespace fsdp
