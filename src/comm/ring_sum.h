#pragma once
// The ring's order of a reduce-scatter's sum, for the shared-memory collectives that must give
// the ring's results bitwise (fp32 and bf16 additions do not associate: another order changes
// bits): rank r's chunk starts from rank r+1's value, adds r+2's, ..., r+w-1's, and its own last.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fsdp {

/// to <- x + y for n floats: the single rounding of ATen's add (bitwise its result), as a plain
/// loop (in small collectives ATen's dispatch and iterator cost more than the additions); with
/// `streaming`, non-temporal stores (for outputs too large to stay in the cache; sums only). A
/// `divisor` other than 1 divides each rounded sum by it: bitwise ATen's div_ by that scalar
/// after the add (one IEEE division each, as ATen divides a float tensor by a scalar).
void add_floats(float* to, const float* x, const float* y, int64_t n, bool streaming, float divisor = 1.0f);

/// out <- peers[0] + peers[1] + ... + own, in that order, over n elements of `dtype`: `peers`
/// point at the other ranks' values in ring order (r+1, r+2, ...). `out` may be `own`; `scratch`
/// (n elements aliasing nothing else; null: allocated when needed) holds the partial sum of three
/// or more ranks. Two ranks in fp32 make no tensor at all (in small units that would cost more
/// than the additions). A `divide_by` other than 1 then divides the sum, as ATen's div_ would
/// (in the same pass over the output for fp32).
void sum_in_ring_order(void* out, const std::vector<const void*>& peers, const void* own, int64_t n,
                       c10::ScalarType dtype, void* scratch, bool streaming, double divide_by = 1.0);

}  // namespace fsdp
