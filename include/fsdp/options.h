#pragma once
/// Options of fully_shard(): how a model is sharded and scheduled.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace fsdp {

/// How parameters, gradients and optimizer state are split across ranks (paper, section 3.2).
enum class ShardingStrategy {
  FullShard,          ///< ZeRO-3: shard over all W ranks; free unsharded parameters after forward
  ShardGradOp,        ///< ZeRO-2: shard over all W ranks; keep them unsharded from forward to backward
  NoShard,            ///< DDP: every rank holds everything; gradients all-reduced
  HybridShard,        ///< FULL_SHARD inside groups of shard_group_size ranks, replicated across groups
  HybridShardGradOp,  ///< SHARD_GRAD_OP inside the groups, replicated across groups
};

/// Whether a strategy keeps a unit's parameters unsharded between its forward and its backward.
bool reshards_after_forward(ShardingStrategy strategy);
bool is_hybrid(ShardingStrategy strategy);

/// When backward issues the all-gather of the next unit (paper, section 3.3.2).
enum class BackwardPrefetch {
  BackwardPre,   ///< when the current unit's backward starts: most overlap, one more unit in memory
  BackwardPost,  ///< when the current unit's gradient is complete, before its reduce-scatter
  None,          ///< only when the next unit's backward starts: least memory, no overlap
};

/// Parses "full", "grad_op", "none", "hybrid" or "hybrid_grad_op"; throws naming the value and
/// the accepted names.
ShardingStrategy parse_sharding_strategy(const std::string& name);
const char* to_string(ShardingStrategy strategy);
/// Parses "pre", "post" or "none".
BackwardPrefetch parse_backward_prefetch(const std::string& name);
const char* to_string(BackwardPrefetch prefetch);

/// Mixed precision (paper, section 4.3): the sharded parameters, their gradients and the optimizer
/// state stay in the model's dtype (fp32 master copies); only the unsharded copies used by forward
/// and backward, and the gradient reductions, run in lower precision.
///
/// Example:
///   auto mp = fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
struct MixedPrecision {
  /// Dtype of the unsharded parameters: each shard is cast before its all-gather (fewer bytes on
  /// the wire), forward and backward compute in it, and floating-point inputs of a unit are cast
  /// to it. Unset: the parameters' own dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
  /// Dtype in which gradients are reduced (reduce-scatter, all-reduce). Unset: param_dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, reduce_dtype) = std::nullopt;
  /// Dtype the module's floating-point buffers are cast to when it is sharded. Unset: unchanged.
  TORCH_ARG(std::optional<c10::ScalarType>, buffer_dtype) = std::nullopt;
  /// BatchNorm1d/2d/3d keep their parameters and running statistics in full precision (gathered
  /// and reduced in the model's dtype) and run on low-precision inputs, as PyTorch FSDP1 does by
  /// default: BatchNorm cannot mix low-precision weights with full-precision statistics, and its
  /// statistics lose their meaning in bf16. false casts them like every other parameter.
  TORCH_ARG(bool, keep_batch_norm_in_full_precision) = true;

 public:
  /// Throws naming the bad dtype: only floating-point dtypes can hold parameters and be reduced.
  void validate() const;
};

/// Parses "fp32", "bf16", "fp16" (also "float32", "bfloat16", "float16", "half"); throws naming the
/// value and the accepted names.
c10::ScalarType parse_dtype(const std::string& name);

/// Everything fully_shard() takes besides the model and the process group.
///
/// Example:
///   auto opts = fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::FullShard);
struct FullyShardOptions {
  /// The sharding strategy of every unit.
  TORCH_ARG(ShardingStrategy, strategy) = ShardingStrategy::FullShard;
  /// Hybrid strategies: ranks per shard group F (consecutive ranks, e.g. one host); W/F replica
  /// groups. 0 takes LOCAL_WORLD_SIZE (the ranks of one host).
  TORCH_ARG(int, shard_group_size) = 0;
  /// Broadcast every buffer (running statistics, masks) from rank 0 when sharding, so ranks agree.
  TORCH_ARG(bool, sync_buffers) = true;
  /// Broadcast every parameter from rank 0 before sharding: ranks may initialise differently
  /// (other seeds, or only rank 0 loads weights) and still train one model.
  TORCH_ARG(bool, sync_module_states) = false;
  /// Check that every rank built the same model (names, shapes, dtypes) before any collective.
  TORCH_ARG(bool, verify_model) = true;
  /// Backward prefetch policy; the order is the reverse of this iteration's forward order.
  TORCH_ARG(BackwardPrefetch, backward_prefetch) = BackwardPrefetch::BackwardPre;
  /// Issue the next unit's all-gather before the current unit's forward, in the previous
  /// iteration's order (none in the first). On by default, unlike PyTorch's FSDP: it gives every
  /// unit's forward a unit's compute of slack against the other ranks (bench/results/latest.md).
  /// A model whose units run in another order from one iteration to the next should turn it off:
  /// a unit gathered in vain keeps its slot of the rate limiter until it runs or backward ends.
  TORCH_ARG(bool, forward_prefetch) = true;
  /// Rate limiter: at most this many units (besides the root) hold unsharded parameters at once
  /// (a prefetch beyond it is skipped), and a unit waits to unshard while more than one
  /// unsharded gradient awaits its reduce-scatter. 0: no limit.
  TORCH_ARG(int, limit_all_gathers) = 2;
  /// Debug: in the first iteration, check that every rank runs the units in the same order
  /// (a store round trip per unit) and fail naming the units instead of hanging.
  TORCH_ARG(bool, check_execution_order) = false;
  /// Mixed precision policy; the default computes and reduces in the parameters' dtype.
  TORCH_ARG(MixedPrecision, mixed_precision) = {};
  /// Activation checkpointing of every unit but the root: forward keeps only each unit's inputs
  /// and backward recomputes its forward (one more forward's compute, far less activation memory).
  /// Every argument of the unit's forward must be a tensor, and it must return one tensor.
  TORCH_ARG(bool, activation_checkpointing) = false;
  /// Where the sharded model computes and communicates (PyTorch FSDP's device_id): the model is
  /// moved there before it is sharded. Unset: the device its parameters are on (CPU for a
  /// deferred model). See [Note: the device seam].
  TORCH_ARG(std::optional<c10::Device>, device) = std::nullopt;
  /// CPU offload (paper, section 3.2): the shards, gradient shards and optimizer state stay in
  /// pinned host memory (the parameters are left on the CPU; buffers move to `device`), each
  /// unit's shard is copied to `device` for its all-gather and its reduced gradient back; the
  /// optimizer steps on the CPU. Needs `device` to be a GPU.
  TORCH_ARG(bool, cpu_offload) = false;
  /// Whether a unit frees its unsharded parameters after its forward (FSDP2's
  /// reshard_after_forward). true saves their memory until backward, at the cost of gathering
  /// them (and, under mixed precision, casting them) again there; false keeps them, trading that
  /// memory for the second all-gather. Unset: the strategy's (true for FULL_SHARD and
  /// HYBRID_SHARD, false for SHARD_GRAD_OP and HYBRID_SHARD_GRAD_OP). The root unit never
  /// reshards after forward: backward starts with it.
  TORCH_ARG(std::optional<bool>, reshard_after_forward) = std::nullopt;
  /// The same per unit, by name ("h.3"): where it returns a value, that unit's choice (e.g.
  /// false for the last block, whose backward runs first); nullopt leaves the unit to the above.
  TORCH_ARG(std::function<std::optional<bool>(const std::string& unit)>, reshard_after_forward_of) =
      nullptr;

 public:
  /// Whether the unit `name` (not the root) frees its unsharded parameters after forward.
  bool unit_reshards_after_forward(const std::string& name) const;
  /// Throws with a message naming the bad value and the fix; `world_size` is the process
  /// group's size (hybrid strategies need a shard group size that divides it).
  void validate(int world_size, std::optional<int> local_world_size = std::nullopt) const;
  /// Ranks per shard group F for `world_size` ranks (W for full and grad_op, 1 for none).
  int shard_group_size_for(int world_size, std::optional<int> local_world_size = std::nullopt) const;
};

}  // namespace fsdp
