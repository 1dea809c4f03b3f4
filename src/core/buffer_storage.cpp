#include "core/buffer_storage.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fsdp {
namespace {

// [Note: huge pages for the refilled buffers]
// The unsharded buffer, its gradient and the gradient shard are given back at every step and
// allocated again at the next; glibc maps buffers this large afresh each time, so the kernel
// faults every 4 KiB page in again (~1.8 us a page on the 2-core bench machine: in a model that
// is one 42 MB unit, 25 k faults, ~45 ms of a rank's ~600 ms step, an unsharded program has
// none of). Asked for transparent huge pages (honoured where THP is "madvise" or "always"), the
// kernel brings in 2 MiB a fault. Memory is not held between steps as it would be if kept.
constexpr size_t kHugePage = size_t{2} << 20;

void advise_huge_pages(void* data, size_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (nbytes < 2 * kHugePage) return;
  const auto page = static_cast<uintptr_t>(4096);
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + nbytes) & ~(page - 1);
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: failure is harmless
#endif
}

}  // namespace

void release_storage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

void refill_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  c10::DataPtr bytes = storage->allocator()->allocate(nbytes);
  if (t.is_cpu()) advise_huge_pages(bytes.get(), nbytes);
  storage->set_data_ptr_noswap(std::move(bytes));
  storage->set_nbytes(nbytes);
}

at::Tensor unallocated(int64_t numel, const at::TensorOptions& options) {
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(nullptr, options.device()),
                       c10::GetAllocator(options.device().type()), /*resizable=*/true);
  at::Tensor tensor = at::empty({0}, options).set_(storage, 0, {numel}, {1});
  release_storage(tensor);
  return tensor;
}

}  // namespace fsdp
