#include "core/flat_layout.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp {

int64_t shard_numel_of(int64_t numel, int f) { return (numel + f - 1) / f; }

int64_t FlatLayout::held_numel() const {
  int64_t held = 0;
  for (const EntryLayout& e : entries) held += e.shard_end - e.shard_begin;
  return held;
}

FlatLayout lay_out_flat(const std::vector<int64_t>& numels, int position, int shard_group_size) {
  TORCH_INTERNAL_ASSERT(shard_group_size >= 1 && position >= 0 && position < shard_group_size);
  FlatLayout layout;
  for (int64_t numel : numels) {
    layout.entries.push_back({layout.numel, numel, 0, 0});
    layout.numel += numel;
  }
  layout.shard_numel = shard_numel_of(layout.numel, shard_group_size);
  layout.padded_numel = layout.shard_numel * shard_group_size;
  // Shard `position` is [position·S, (position+1)·S) of the padded buffer; a parameter's piece is
  // its overlap with it.
  const int64_t shard_offset = position * layout.shard_numel;
  for (EntryLayout& e : layout.entries) {
    e.shard_begin = std::clamp(e.offset - shard_offset, int64_t{0}, layout.shard_numel);
    e.shard_end = std::clamp(e.offset + e.numel - shard_offset, int64_t{0}, layout.shard_numel);
  }
  return layout;
}

}  // namespace fsdp
