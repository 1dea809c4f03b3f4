#pragma once
// memcpy for FSDP's bulk host copies, without glibc's slow case on AMD Zen ([Note: rep movsb's
// short distance] in copy_bytes.cpp).

#include <cstddef>

namespace fsdp {

/// to[0, n) <- from[0, n); the ranges must not overlap.
void copy_bytes(void* to, const void* from, size_t n);

}  // namespace fsdp
