#include "io/tensor_boxes.h"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

namespace fsdp {

namespace {

// Appends the boxes of [begin, end) of the sub-tensor shape[dim:], whose element 0 lies at
// `prefix` (the leading offsets, each box of size 1 there) and at flat index `base`.
void append_boxes(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& prefix,
                  int64_t base, int64_t begin, int64_t end, std::vector<TensorBox>& out) {
  if (begin >= end) return;
  // A box: the prefix's single indices, then `offsets`/`sizes` from dimension `dim` on.
  auto add_box = [&](const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
                     int64_t first, int64_t last) {
    TensorBox b;
    b.offsets = prefix;
    b.offsets.insert(b.offsets.end(), offsets.begin(), offsets.end());
    b.sizes.assign(prefix.size(), 1);
    b.sizes.insert(b.sizes.end(), sizes.begin(), sizes.end());
    b.begin = base + first;
    b.end = base + last;
    out.push_back(std::move(b));
  };
  if (dim == shape.size()) return add_box({}, {}, begin, end);  // 0-d
  if (dim + 1 == shape.size()) return add_box({begin}, {end - begin}, begin, end);  // 1-D: any range is a box
  // Index i of dimension `dim` is a "row": elements [i * row, (i + 1) * row).
  const int64_t row = c10::numelements_from_dim(static_cast<int>(dim) + 1, shape);
  auto within_row = [&](int64_t index, int64_t from, int64_t to) {
    prefix.push_back(index);
    append_boxes(shape, dim + 1, prefix, base + index * row, from, to, out);
    prefix.pop_back();
  };
  const int64_t first_full = (begin + row - 1) / row, end_full = end / row;  // whole rows
  if (first_full > end_full) return within_row(begin / row, begin % row, end - begin / row * row);
  if (begin % row != 0) within_row(begin / row, begin % row, row);
  if (end_full > first_full) {
    std::vector<int64_t> offsets{first_full}, sizes{end_full - first_full};
    offsets.resize(shape.size() - dim, 0);
    sizes.insert(sizes.end(), shape.begin() + dim + 1, shape.end());
    add_box(offsets, sizes, first_full * row, end_full * row);
  }
  if (end % row != 0) within_row(end_full, 0, end % row);
}

}  // namespace

std::vector<TensorBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const int64_t numel = c10::multiply_integers(shape);
  TORCH_CHECK(0 <= begin && begin <= end && end <= numel, "boxes_of_range: [", begin, ", ", end,
              ") is not a range of a tensor of ", numel, " elements");
  std::vector<TensorBox> boxes;
  std::vector<int64_t> prefix;
  append_boxes(shape, 0, prefix, 0, begin, end, boxes);
  return boxes;
}

}  // namespace fsdp
