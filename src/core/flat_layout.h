#pragma once
// How a unit's parameters are cut into shards, without a tensor: one flat buffer of the
// parameters one after another, right-padded to F equal shards (F: the shard group's size), and
// each parameter's piece of each shard. FlatParam is built from it, and the planner lays a
// planned unit out with it ([Note: one rulebook, two readers] in core/unit_rules.h).

#include <cstdint>
#include <vector>

namespace fsdp {

/// Elements of each of the `f` equal shards of a flat buffer of `numel` elements (the buffer is
/// padded to f times it): the one place a unit's shard size is computed.
int64_t shard_numel_of(int64_t numel, int f);

/// One parameter in the flat buffer, and its piece of one rank's shard.
struct EntryLayout {
  int64_t offset = 0;       ///< start in the unsharded flat buffer
  int64_t numel = 0;
  int64_t shard_begin = 0;  ///< the piece, as [begin, end) offsets into the rank's shard
  int64_t shard_end = 0;    ///<   (empty when begin == end)
};

/// A unit's flat buffer as shard `position` of a shard group of `shard_group_size` sees it.
struct FlatLayout {
  int64_t numel = 0;        ///< every parameter's elements
  int64_t shard_numel = 0;  ///< of each shard
  int64_t padded_numel = 0; ///< shard_numel times the shard group's size
  std::vector<EntryLayout> entries;

  /// Elements of the shard that parameters hold (the padding excluded).
  int64_t held_numel() const;
};

/// Lays out parameters of `numels` elements, in order, for shard `position`.
FlatLayout lay_out_flat(const std::vector<int64_t>& numels, int position, int shard_group_size);

}  // namespace fsdp
