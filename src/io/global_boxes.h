#pragma once
// [Note: boxes of a tensor-parallel part]
// Under tensor parallelism (include/fsdp/parallelize.h) a rank's parameter is its tp rank's part
// of the whole one, and FSDP shards that part: a rank's piece is a range [begin, end) of the
// flattened PART. A checkpoint describes what it saves in the WHOLE parameter's coordinates, so
// that any layout (another dp or tp size, none) reads it and torch.distributed.checkpoint places
// it: the range is cut into boxes of the part ([Note: boxes of a flat shard]), and each box moved
// to where the part lies in the whole: along the split dimension, by the tp rank's offset. A
// fused parameter (GPT-2's c_attn, q, k and v side by side, each split) holds `chunks` slices
// along that dimension, each in its own place in the whole: a box crossing a slice's edge is cut
// there. The same boxes tell a loading rank which elements of the whole its piece needs.
// A box of the whole is in general not a range of its flattened elements (a row-wise weight's
// part is a column block); a checkpoint records those as boxes, the others as ranges as before.

#include "core/sharded_view.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fsdp::detail {

/// How a parameter's part lies in the whole (tp::Placement's facts; none: the part is the whole).
struct PartInWhole {
  int64_t dim = -1;                   ///< split dimension; -1: whole on every tp rank
  int64_t chunks = 1;                 ///< fused slices along `dim`, each split
  int64_t rank = 0;                   ///< this rank's index in the tensor-parallel group
  std::vector<int64_t> whole_shape;   ///< the whole parameter's shape
};

/// The part of `param` as its tensor-parallel placement says (the whole, in its own shape, when
/// it has none: a model without tensor parallelism).
PartInWhole part_in_whole(const ShardedParam& param);

/// One box of the whole parameter that a rank's piece holds.
struct PlacedBox {
  std::vector<int64_t> offsets;  ///< in the whole parameter
  std::vector<int64_t> sizes;
  // Where it is in the piece: the range [begin, end) of the flattened part, a box of the part of
  // shape `part_sizes`, narrowed along `cut_dim` from `cut_start` when a slice's edge cut it.
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<int64_t> part_sizes;
  int64_t cut_dim = -1;
  int64_t cut_start = 0;

  /// This box's elements in `piece` (1-D, elements [piece_begin, ...) of the flattened part):
  /// a view, strided when it was cut.
  at::Tensor view_in(const at::Tensor& piece, int64_t piece_begin) const;
  int64_t numel() const;
};

/// The boxes of the whole that elements [begin, end) of the flattened part hold, in the part's
/// element order.
std::vector<PlacedBox> boxes_in_whole(const std::vector<int64_t>& part_shape, int64_t begin, int64_t end,
                                      const PartInWhole& part);

/// The box as a range [begin, end) of the whole's flattened elements, when it is one.
bool box_is_range(const std::vector<int64_t>& shape, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& sizes, int64_t& begin, int64_t& end);

}  // namespace fsdp::detail
