#pragma once
// What shared-memory collectives offer beside the Collectives interface ([Note: decoupled
// collectives] in shm_collectives.cpp): a board of shards published once per step, and
// reduce-scatters posted to complete later. Only the shared-memory collectives implement it, and
// only the units' board variant (core/unit_collectives.cpp) uses it. Like any collective, every
// rank calls these in the same order.

#include "comm/collectives.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace fsdp {

class PublishingCollectives {
 public:
  virtual ~PublishingCollectives() = default;

  /// A forward of the root starts: publishes this rank's `shards` (the same count, sizes and
  /// dtypes on every rank) for published_unsharded until the next call, when nothing may point
  /// into the previous publication any more. False (on every rank) when nothing could be
  /// published (the board could not be set up, or no shard fits on it).
  virtual bool publish_shards(const std::vector<at::Tensor>& shards) = 0;
  /// What all_gather of published shard `index` would write, already in place: every rank's
  /// shard side by side (1-D, W·S) in memory the ranks share, once each peer has published it;
  /// valid until the next publish_shards, and nobody may write it. nullptr where the board
  /// keeps no such buffer for the shard (then all_gather it).
  virtual void* published_unsharded(size_t index) = 0;
  /// reduce_scatter_sum that may finish later, then shard.div_(divide_by): `full` may be reused
  /// once it returns, and `shard` holds the quotient once the returned function has run (at once
  /// when it is empty).
  virtual std::function<void()> reduce_scatter_sum_posted(const at::Tensor& shard, const at::Tensor& full,
                                                          double divide_by) = 0;
  /// Completes every posted reduce-scatter (backward has ended); later ones may reuse its space.
  virtual void complete_posted() = 0;
};

/// `collectives`' board and postings, or nullptr where it has none (every implementation but
/// the shared-memory one).
PublishingCollectives* publishing_side(Collectives& collectives);

}  // namespace fsdp
