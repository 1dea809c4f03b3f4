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

/// Parses "full" into a strategy; throws naming the value and the accepted names.
ShardingStrategy parse_sharding_strategy(const std::string& name);
const char* to_string(ShardingStrategy strategy);

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


 public:
  /// Throws with a message naming the bad value and the fix.
  void validate() const;
};

}  // namespace fsdp
