// The counting allocator honours the whole c10::Allocator contract ([Note: the allocator
// contract] in src/device/memory_counter.cpp) and counts exactly. The contract is tested directly, on
// every CPU: which kernels use raw_allocate (oneDNN's bf16 matmul, convolutions) depends on the
// CPU, the operations below run wherever they land.
#include <fsdp/memory.h>

#include "device/memory_counter.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

class MemoryCounter : public ::testing::Test {
 protected:
  void SetUp() override {
    fsdp::install_memory_counter();
    base_ = fsdp::memory_stats().current_bytes;
    fsdp::reset_peak_memory();
  }
  int64_t current() const { return fsdp::memory_stats().current_bytes - base_; }
  int64_t peak() const { return fsdp::memory_stats().peak_bytes - base_; }

  // Runs `op` on the tensors `make_inputs` returns and checks the counter after each stage:
  // exactly the live tensors' bytes, a peak that covered inputs and output at once, nothing
  // left afterwards.
  template <typename MakeInputs, typename Op>
  void expect_exact_counts(MakeInputs make_inputs, Op op) {
    std::vector<at::Tensor> inputs = make_inputs();
    int64_t input_bytes = 0;
    for (const auto& t : inputs) input_bytes += bytes_of(t);
    EXPECT_EQ(current(), input_bytes);
    fsdp::reset_peak_memory();
    EXPECT_EQ(peak(), input_bytes);
    {
      at::Tensor out = op(inputs);
      EXPECT_EQ(current(), input_bytes + bytes_of(out));
      EXPECT_GE(peak(), input_bytes + bytes_of(out));
    }
    inputs.clear();
    EXPECT_EQ(current(), 0);
  }

  int64_t base_ = 0;
};

// A tensor on borrowed bytes (a unit computing on a board of published shards) counts them while
// its storage holds them, frees nothing of the owner's, and is no allocation.
TEST_F(MemoryCounter, BorrowedBytesCountWhileATensorHoldsThem) {
  std::vector<float> owner(1000, 2.0f);
  const int64_t allocations = fsdp::memory_stats().allocations;
  {
    at::Storage storage(at::Storage::use_byte_size_t(), owner.size() * sizeof(float),
                        fsdp::counted_borrow(owner.data(), owner.size() * sizeof(float), at::Device(at::kCPU)),
                        /*allocator=*/nullptr, /*resizable=*/false);
    const at::Tensor t = at::empty({0}).set_(storage, 0, {1000}, {1});
    EXPECT_EQ(current(), 4000);
    EXPECT_EQ(t.sum().item<float>(), 2000.0f);
  }
  EXPECT_EQ(current(), 0);
  EXPECT_EQ(peak(), 4000 + 4);  // and the sum's scalar
  EXPECT_EQ(fsdp::memory_stats().allocations - allocations, 1) << "the sum's output, not the borrow";
  EXPECT_EQ(owner[999], 2.0f);
}

TEST_F(MemoryCounter, IsTheCpuAllocatorAndOffersTheRawInterface) {
  c10::Allocator* allocator = c10::GetAllocator(c10::kCPU);
  ASSERT_TRUE(fsdp::memory_counter_installed());
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  c10::DataPtr data = allocator->allocate(100);
  EXPECT_EQ(data.get(), data.get_context());  // what raw_allocate and copy-on-write require
  EXPECT_TRUE(allocator->is_simple_data_ptr(data));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data.get()) % 64, 0u);  // the alignment ATen expects
  EXPECT_EQ(current(), 100);
}

TEST_F(MemoryCounter, RawAllocateAndDeallocateCountExactly) {
  c10::Allocator* allocator = c10::GetAllocator(c10::kCPU);
  void* a = allocator->raw_allocate(1000);
  void* b = allocator->raw_allocate(24);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(current(), 1024);
  EXPECT_EQ(peak(), 1024);
  allocator->raw_deallocate(a);
  EXPECT_EQ(current(), 24);
  EXPECT_EQ(peak(), 1024);
  allocator->raw_deallocate(b);
  EXPECT_EQ(current(), 0);

  void* empty = allocator->raw_allocate(0);  // zero bytes: nothing counted, nothing to free
  EXPECT_EQ(empty, nullptr);
  EXPECT_EQ(current(), 0);
  allocator->raw_deallocate(empty);
  allocator->raw_deallocate(nullptr);
  EXPECT_EQ(current(), 0);
  EXPECT_EQ(peak(), 1024);
}

TEST_F(MemoryCounter, TensorsAndKernelOutputsAreCountedAndFreed) {
  {
    auto t = at::empty({1024, 256}, at::kFloat);  // 1 MiB
    EXPECT_EQ(current(), 1 << 20);
    auto u = t.matmul(at::ones({256, 8}));
    EXPECT_EQ(current(), (1 << 20) + 1024 * 8 * 4);  // the ones are gone, the output is live
    EXPECT_GE(peak(), (1 << 20) + 256 * 8 * 4 + 1024 * 8 * 4);
  }
  EXPECT_EQ(current(), 0);
}

TEST_F(MemoryCounter, Bf16MatmulIsCountedExactly) {
  expect_exact_counts(
      [] { return std::vector<at::Tensor>{at::randn({64, 64}).to(at::kBFloat16), at::randn({64, 64}).to(at::kBFloat16)}; },
      [](const std::vector<at::Tensor>& in) { return at::mm(in[0], in[1]); });
}

TEST_F(MemoryCounter, Conv2dIsCountedExactlyInFp32AndBf16) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    expect_exact_counts(
        [dtype] { return std::vector<at::Tensor>{at::randn({2, 3, 16, 16}).to(dtype), at::randn({8, 3, 3, 3}).to(dtype)}; },
        [](const std::vector<at::Tensor>& in) { return at::conv2d(in[0], in[1]); });
  }
}

TEST_F(MemoryCounter, CopyOnWriteClonesShareUntilWrittenAndFreeOnce) {
  {
    at::Tensor t = at::arange(1000, at::kFloat);
    EXPECT_EQ(current(), 4000);
    at::Tensor clone = at::_lazy_clone(t);
    EXPECT_EQ(current(), 4000);  // shared, not copied
    clone.add_(1);               // the first write materialises a copy
    EXPECT_EQ(current(), 8000);
    EXPECT_EQ(clone[999].item<float>(), 1000.0f);
    EXPECT_EQ(t[999].item<float>(), 999.0f);
  }
  EXPECT_EQ(current(), 0);
  {
    at::Tensor t = at::arange(10, at::kFloat);
    at::Tensor clone = at::_lazy_clone(t);
    t.reset();  // the clone outlives its source: the bytes stay until it goes
    EXPECT_EQ(current(), 40);
  }
  EXPECT_EQ(current(), 0);
}

}  // namespace
