#pragma once
// Whether the parameters tensor parallelism replicates (norms, row-wise biases, positions) still
// agree over each tp group: [Note: replicas that drifted apart] in tp_replica_check.cpp.

#include "core/sharded_view.h"

#include <string>

namespace fsdp::detail {

/// Compares a checksum of each replicated parameter's piece over its tp group (two collectives
/// of the group and one of the shard group, on every rank of the model in the same order) and
/// warns, on rank 0, naming those that differ and the fix. `where`: the save that checks ("save_checkpoint").
/// Returns the names that differ (empty: all agree, or the model is not tensor-parallel).
std::vector<std::string> warn_if_replicas_drifted(const ShardedView& model, const std::string& where);

}  // namespace fsdp::detail
