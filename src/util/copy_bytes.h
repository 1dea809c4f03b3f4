#pragma once
// memcpy for FSDP's bulk host copies, without glibc's slow case on AMD Zen ([Note: rep movsb's
// short distance] in copy_bytes.cpp), and its streaming form for large outputs.

#include <cstddef>

namespace fsdp {

/// to[0, n) <- from[0, n); the ranges must not overlap.
void copy_bytes(void* to, const void* from, size_t n);
/// copy_bytes with non-temporal stores (x86): the destination is neither read first nor kept in
/// the cache, for outputs too large to stay there; visible to what follows (a fence).
void stream_bytes(void* to, const void* from, size_t n);

}  // namespace fsdp
