#pragma once
// CRC-32 of bytes: what checkpoints record for every saved tensor, and what safetensors and
// torch.save files are checked against.

#include <cstddef>
#include <cstdint>

namespace fsdp {

/// CRC-32 (IEEE, as zlib.crc32 in Python) of `size` bytes, continuing from `crc`.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace fsdp
