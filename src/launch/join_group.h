#pragma once
// The rendezvous of init_distributed, also for a group other than the launch's world (one
// replica's ranks: init_replicas).

#include <fsdp/distributed.h>

#include <memory>
#include <string>

namespace fsdp {

/// Connects to the store as `process` launched (rank 0 serves it unless an agent does), then
/// forms the world process group of `group`'s ranks, its keys under `store_prefix` (empty: the
/// launch's attempt, as init_distributed).
std::shared_ptr<Distributed> join_group(const LaunchEnv& process, const LaunchEnv& group,
                                        InitOptions options, const std::string& store_prefix);

}  // namespace fsdp
