#include "launch/host_placement.h"

#include <map>

namespace fsdp {

namespace {

// "ranks 2-3 on a (2), b (3)"
std::string describe_group(const std::vector<std::string>& hosts, int first, int f) {
  std::map<std::string, std::string> ranks_by_host;
  for (int r = first; r < first + f; ++r) {
    std::string& ranks = ranks_by_host[hosts[r]];
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string out = "ranks " + std::to_string(first) + "-" + std::to_string(first + f - 1) + " on ";
  bool first_host = true;
  for (const auto& [host, ranks] : ranks_by_host) {
    out += (first_host ? "" : ", ") + host + " (rank " + ranks + ")";
    first_host = false;
  }
  return out;
}

}  // namespace

std::string shard_groups_spanning_hosts(const std::vector<std::string>& hosts, int f) {
  const int world = static_cast<int>(hosts.size());
  if (f <= 1 || world % f != 0) return "";
  std::string groups;
  int spanning = 0;
  for (int first = 0; first < world; first += f) {
    bool one_host = true;
    for (int r = first + 1; r < first + f; ++r) one_host = one_host && hosts[r] == hosts[first];
    if (one_host) continue;
    if (++spanning <= 4) groups += "\n  " + describe_group(hosts, first, f);
  }
  if (spanning == 0) return "";
  if (spanning > 4) groups += "\n  ... and " + std::to_string(spanning - 4) + " more";
  return "fsdp: warning: hybrid sharding with shard groups of " + std::to_string(f) + " ranks: " +
         std::to_string(spanning) + " of " + std::to_string(world / f) +
         " shard groups span hosts, so their all-gathers and reduce-scatters cross the network:" +
         groups +
         "\nStart the same number of ranks on every host with consecutive RANKs per host (fsdprun, "
         "torchrun and srun's block distribution do) and leave the shard group size at its default "
         "(LOCAL_WORLD_SIZE, the ranks of one host), or set it to the ranks per host.";
}

}  // namespace fsdp
