#pragma once
// [Note: boxes of a flat shard]
// FSDP shards a parameter by element ranges of its flattened (row-major) form: a rank holds
// elements [begin, end), which in general starts and ends mid-row. torch.distributed.checkpoint
// describes a saved chunk as an N-D box (offsets and sizes per dimension), so a range is saved as
// the few boxes it decomposes into: the rest of a partial first row (itself a range of the row's
// sub-tensor, decomposed the same way), the whole rows in the middle, the start of a partial last
// row. A range of a tensor of n dimensions needs at most 2n - 1 boxes (3 for a matrix), and each
// box is again a contiguous range, so saving copies nothing: every box is a view of the shard.

#include <cstdint>
#include <vector>

namespace fsdp {

/// A box of a tensor that is also the contiguous range [begin, end) of its flattened elements.
struct TensorBox {
  std::vector<int64_t> offsets;  // per dimension
  std::vector<int64_t> sizes;    // per dimension
  int64_t begin = 0;
  int64_t end = 0;
};

/// The boxes that exactly tile elements [begin, end) of a row-major tensor of `shape`, in element
/// order. None for an empty range; one box for a 0-d or 1-D tensor.
std::vector<TensorBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

}  // namespace fsdp
