#include "io/global_boxes.h"

#include "io/tensor_boxes.h"

#include <fsdp/parallelize.h>

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

namespace fsdp::detail {

PartInWhole part_in_whole(const ShardedParam& param) {
  const auto& placement = param.tensor_parallel();
  if (!placement || placement->replicated()) return PartInWhole{-1, 1, 0, param.shape()};
  return PartInWhole{placement->dim, placement->fused_chunks, placement->tp->rank(), placement->global_shape};
}

at::Tensor PlacedBox::view_in(const at::Tensor& piece, int64_t piece_begin) const {
  at::Tensor box = piece.narrow(0, begin - piece_begin, end - begin).view(part_sizes);
  return cut_dim < 0 ? box : box.narrow(cut_dim, cut_start, sizes[cut_dim]);
}

int64_t PlacedBox::numel() const { return c10::multiply_integers(sizes); }

std::vector<PlacedBox> boxes_in_whole(const std::vector<int64_t>& part_shape, int64_t begin, int64_t end,
                                      const PartInWhole& part) {
  std::vector<PlacedBox> out;
  for (const TensorBox& box : boxes_of_range(part_shape, begin, end)) {
    PlacedBox placed{box.offsets, box.sizes, box.begin, box.end, box.sizes, -1, 0};
    if (part.dim < 0) {
      out.push_back(std::move(placed));
      continue;
    }
    const auto d = static_cast<size_t>(part.dim);
    TORCH_CHECK(d < part_shape.size() && part_shape[d] % part.chunks == 0, "checkpoint: a tensor-parallel "
                "part of shape [", part_shape.size(), " dims] cannot be split along dimension ", part.dim);
    // Along d, the part is `chunks` slices of `slice` indices; slice c of rank r lies at
    // c * whole_slice + r * slice in the whole.
    const int64_t slice = part_shape[d] / part.chunks, whole_slice = part.whole_shape[d] / part.chunks;
    const int64_t first = box.offsets[d], last = box.offsets[d] + box.sizes[d];
    for (int64_t from = first; from < last;) {
      const int64_t c = from / slice, to = std::min(last, (c + 1) * slice);
      PlacedBox cut = placed;
      cut.offsets[d] = c * whole_slice + part.rank * slice + (from - c * slice);
      cut.sizes[d] = to - from;
      if (to - from != box.sizes[d]) {
        cut.cut_dim = part.dim;
        cut.cut_start = from - first;
      }
      out.push_back(std::move(cut));
      from = to;
    }
  }
  return out;
}

bool box_is_range(const std::vector<int64_t>& shape, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& sizes, int64_t& begin, int64_t& end) {
  // Row-major: contiguous when every dimension after the first of size > 1 is whole.
  size_t first_wide = 0;
  while (first_wide < sizes.size() && sizes[first_wide] == 1) ++first_wide;
  for (size_t j = first_wide + 1; j < sizes.size(); ++j) {
    if (sizes[j] != shape[j]) return false;
  }
  begin = 0;
  for (size_t j = 0; j < shape.size(); ++j) begin = begin * shape[j] + offsets[j];
  end = begin + c10::multiply_integers(sizes);
  return true;
}

}  // namespace fsdp::detail
