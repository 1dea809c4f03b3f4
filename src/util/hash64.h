#pragma once
// A 64-bit hash of bytes, for comparing tensors across ranks bitwise: two tensors hash alike
// only if their bytes are the same in the same order (NaN, inf and -0.0 are bits like any other),
// unlike sums, which a permutation (a transposed matrix) or a non-finite value defeats.
// Not cryptographic: it tells honest differences apart (a collision is 2^-64 likely).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdp {

/// The bytes are hashed in chunks of this size, in parallel; the chunks' hashes are then hashed
/// in order. A caller that hands the bytes over in several blocks cuts them at multiples of it.
constexpr size_t kHashChunkBytes = size_t{1} << 20;

/// Appends the hash of each kHashChunkBytes chunk of `size` bytes (the last one shorter) to `out`.
void hash_chunks(const void* data, size_t size, std::vector<uint64_t>& out);

/// The hash of bytes whose chunks hashed to `chunks` (in order), `total` bytes in all.
uint64_t combine_chunk_hashes(const std::vector<uint64_t>& chunks, uint64_t total);

/// combine_chunk_hashes of hash_chunks: the hash of `size` bytes.
uint64_t hash64(const void* data, size_t size);

}  // namespace fsdp
