#pragma once
// Which hosts the shard groups of a hybrid strategy land on.

#include <string>
#include <vector>

namespace fsdp {

/// hosts[r]: the host name of world rank r. Shard groups are blocks of f consecutive ranks. A
/// warning naming every shard group whose ranks are on more than one host (their all-gathers and
/// reduce-scatters would cross the network, which hybrid sharding exists to avoid), and the fix;
/// "" when every shard group is on one host.
std::string shard_groups_spanning_hosts(const std::vector<std::string>& hosts, int f);

}  // namespace fsdp
