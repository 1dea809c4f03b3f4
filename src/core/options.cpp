#include <fsdp/options.h>


#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <utility>

namespace fsdp {

namespace {

constexpr std::pair<ShardingStrategy, const char*> kStrategyNames[] = {
    {ShardingStrategy::FullShard, "full"},
    {ShardingStrategy::ShardGradOp, "grad_op"},
    {ShardingStrategy::NoShard, "none"},
    {ShardingStrategy::HybridShard, "hybrid"},
    {ShardingStrategy::HybridShardGradOp, "hybrid_grad_op"},
};

}  // namespace

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  for (const auto& [strategy, text] : kStrategyNames) {
    if (name == text) return strategy;
  }
  TORCH_CHECK(false, "unknown sharding strategy '", name,
              "': use 'full', 'grad_op', 'none', 'hybrid' or 'hybrid_grad_op'");
}

const char* to_string(ShardingStrategy strategy) {
  for (const auto& [value, text] : kStrategyNames) {
    if (value == strategy) return text;
  }
  return "?";
}

bool reshards_after_forward(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::FullShard || strategy == ShardingStrategy::HybridShard;
}

bool FullyShardOptions::unit_reshards_after_forward(const std::string& name) const {
  if (reshard_after_forward_of()) {
    if (const std::optional<bool> choice = reshard_after_forward_of()(name)) return *choice;
  }
  return reshard_after_forward().value_or(reshards_after_forward(strategy()));
}

bool is_hybrid(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::HybridShard ||
         strategy == ShardingStrategy::HybridShardGradOp;
}

BackwardPrefetch parse_backward_prefetch(const std::string& name) {
  if (name == "pre") return BackwardPrefetch::BackwardPre;
  if (name == "post") return BackwardPrefetch::BackwardPost;
  if (name == "none") return BackwardPrefetch::None;
  TORCH_CHECK(false, "unknown backward prefetch '", name, "': use 'pre', 'post' or 'none'");
}

const char* to_string(BackwardPrefetch prefetch) {
  switch (prefetch) {
    case BackwardPrefetch::BackwardPre:
      return "pre";
    case BackwardPrefetch::BackwardPost:
      return "post";
    case BackwardPrefetch::None:
      return "none";
  }
  return "?";
}

int FullyShardOptions::shard_group_size_for(int world_size,
                                            std::optional<int> local_world_size) const {
  if (strategy() == ShardingStrategy::NoShard) return 1;
  if (!is_hybrid(strategy())) return world_size;
  if (shard_group_size() > 0) return shard_group_size();
  return local_world_size.value_or(world_size);
}

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "float") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return at::kHalf;
  TORCH_CHECK(false, "unknown dtype '", name, "': use 'fp32', 'bf16' or 'fp16'");
}

void MixedPrecision::validate() const {
  const std::pair<const char*, std::optional<c10::ScalarType>> dtypes[] = {
      {"param_dtype", param_dtype()}, {"reduce_dtype", reduce_dtype()}, {"buffer_dtype", buffer_dtype()}};
  for (const auto& [what, dtype] : dtypes) {
    if (!dtype) continue;
    // Gradients are summed by the collectives' own additions, in ATen: integer, boolean and
    // complex dtypes cannot hold real gradients, and the float8 dtypes have no addition.
    const bool reducible = *dtype == at::kFloat || *dtype == at::kDouble ||
                           *dtype == at::kBFloat16 || *dtype == at::kHalf;
    TORCH_CHECK(reducible, "MixedPrecision::", what, "(", c10::toString(*dtype),
                "): gradients and parameters cannot be computed or reduced in this dtype; use "
                "at::kBFloat16, at::kHalf, at::kFloat or at::kDouble");
  }
}

void FullyShardOptions::validate(int world_size, std::optional<int> local_world_size) const {
  mixed_precision().validate();
  TORCH_CHECK(!cpu_offload() || (device() && !device()->is_cpu()),
              "FullyShardOptions::cpu_offload(true) keeps the shards in host memory and computes "
              "on a GPU: set FullyShardOptions::device (e.g. torch::Device(torch::kCUDA, "
              "LOCAL_RANK)) with the model left on the CPU");
  TORCH_CHECK(limit_all_gathers() >= 0, "FullyShardOptions::limit_all_gathers(",
              limit_all_gathers(), "): must be >= 0 (0 turns the rate limiter off; 2 is the default)");
  TORCH_CHECK(shard_group_size() >= 0, "FullyShardOptions::shard_group_size(", shard_group_size(),
              "): must be positive (or 0 for LOCAL_WORLD_SIZE)");
  TORCH_CHECK(is_hybrid(strategy()) || shard_group_size() == 0 ||
                  shard_group_size() == shard_group_size_for(world_size, local_world_size),
              "FullyShardOptions::shard_group_size(", shard_group_size(), ") applies to the hybrid "
              "strategies only; strategy '", to_string(strategy()), "' shards over ",
              shard_group_size_for(world_size, local_world_size), " ranks. Use strategy 'hybrid' or drop the size.");
  if (!is_hybrid(strategy())) return;
  const int f = shard_group_size_for(world_size, local_world_size);
  TORCH_CHECK(f >= 1 && world_size % f == 0, "shard group size ", f, " does not divide the world ",
              "size ", world_size, ": hybrid sharding needs W = F x R; pick F among the divisors of ",
              world_size, " (e.g. the ranks per host).");
  TORCH_CHECK(world_size / f >= 2, "hybrid sharding with shard group size ", f, " on ", world_size,
              " ranks leaves a single replica group: it needs at least 2 (W >= 2F). Use strategy "
              "'full' (or 'grad_op') for one group, or a smaller shard group size.");
}

}  // namespace fsdp
