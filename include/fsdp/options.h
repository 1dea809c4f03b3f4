#pragma once
/// Options of fully_shard(): how a model is sharded and scheduled.

#include <torch/arg.h>

#include <cstdint>
#include <string>

namespace fsdp {

/// How parameters, gradients and optimizer state are split across ranks (paper, section 3.2).
enum class ShardingStrategy {
  FullShard,  ///< ZeRO-3: shard everything; free unsharded parameters after forward and backward.
};

/// When backward issues the all-gather of the next unit (paper, section 3.3.2).
enum class BackwardPrefetch {
  BackwardPre,   ///< when the current unit's backward starts: most overlap, one more unit in memory
  BackwardPost,  ///< when the current unit's gradient is complete, before its reduce-scatter
  None,          ///< only when the next unit's backward starts: least memory, no overlap
};

/// Parses "full" into a strategy; throws naming the value and the accepted names.
ShardingStrategy parse_sharding_strategy(const std::string& name);
const char* to_string(ShardingStrategy strategy);
/// Parses "pre", "post" or "none".
BackwardPrefetch parse_backward_prefetch(const std::string& name);
const char* to_string(BackwardPrefetch prefetch);

/// Everything fully_shard() takes besides the model and the process group.
///
/// Example:
///   auto opts = fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::FullShard);
struct FullyShardOptions {
  /// The sharding strategy of every unit.
  TORCH_ARG(ShardingStrategy, strategy) = ShardingStrategy::FullShard;
  /// Broadcast every buffer (running statistics, masks) from rank 0 when sharding, so ranks agree.
  TORCH_ARG(bool, sync_buffers) = true;
  /// Check that every rank built the same model (names, shapes, dtypes) before any collective.
  TORCH_ARG(bool, verify_model) = true;
  /// Backward prefetch policy; the order is the reverse of this iteration's forward order.
  TORCH_ARG(BackwardPrefetch, backward_prefetch) = BackwardPrefetch::BackwardPre;
  /// Issue the next unit's all-gather before the current unit's forward (static graphs only: the
  /// order is the previous iteration's).
  TORCH_ARG(bool, forward_prefetch) = false;
  /// Rate limiter: at most this many units (besides the root) hold unsharded parameters or
  /// gradients at once; a prefetch waits for an earlier unit to be freed. 0: no limit.
  TORCH_ARG(int, limit_all_gathers) = 2;
  /// Debug: in the first iteration, check that every rank runs the units in the same order
  /// (a store round trip per unit) and fail naming the units instead of hanging.
  TORCH_ARG(bool, check_execution_order) = false;


 public:
  /// Throws with a message naming the bad value and the fix.
  void validate() const;
};

}  // namespace fsdp
