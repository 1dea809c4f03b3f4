#pragma once
// What the library itself tells the memory counter (include/fsdp/memory.h) beyond the
// allocations it sees.

#include <c10/core/Allocator.h>

#include <cstddef>

namespace fsdp {

/// A pointer to `nbytes` at `bytes` that this process does not own and must not free (a board of
/// published shards in shared memory), for a tensor's storage. While the pointer lives, the
/// memory counter counts those bytes as tensor memory of this process (not as an allocation): a
/// tensor computing on them holds them as much as one that allocated its own.
c10::DataPtr counted_borrow(void* bytes, size_t nbytes, c10::Device device);

}  // namespace fsdp
