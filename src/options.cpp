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

void FullyShardOptions::validate() const {}

}  // namespace fsdp
