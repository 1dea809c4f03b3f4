#include <fsdp/options.h>

#include <c10/util/Exception.h>

namespace fsdp {

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (name == "full") return ShardingStrategy::FullShard;
  TORCH_CHECK(false, "unknown sharding strategy '", name, "': use 'full'");
}

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FullShard:
      return "full";
  }
  return "?";
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

void FullyShardOptions::validate() const {
  TORCH_CHECK(limit_all_gathers() >= 0, "FullyShardOptions::limit_all_gathers(",
              limit_all_gathers(), "): must be >= 0 (0 turns the rate limiter off; 2 is the default)");
}

}  // namespace fsdp
