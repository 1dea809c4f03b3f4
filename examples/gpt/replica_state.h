#pragma once
// --fault-tolerant: what a live replica hands a replacement (fsdp::ReplicaQuorum), and the
// hashes that show the replicas hold bitwise the same state.

#include "gpt.h"
#include "train_optimizers.h"

#include <fsdp/fully_shard.h>
#include <fsdp/replica_quorum.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gpt {

/// This rank's parameter shards (received in place), in the model's order.
std::vector<at::Tensor> replica_tensors(fsdp::Unit<GPT>& model);

/// The parameter shards, and as bytes AdamW's state and the step to continue from: what the
/// checkpoint would keep (the data position and the learning rate follow from the step).
fsdp::ReplicaState replica_state(fsdp::Unit<GPT>& model, const TrainOptimizers& optimizers,
                                 int64_t next_step);

/// Loads the bytes of replica_state into `optimizers`; returns the step to continue from.
int64_t load_replica_bytes(const std::string& bytes, TrainOptimizers& optimizers);

/// {"params_hash", "optimizer_hash"}: 64-bit hashes of this rank's shards and of AdamW's state
/// for them (moments and step counts), equal across replicas exactly when the bits are.
nlohmann::json state_hashes(fsdp::Unit<GPT>& model, const TrainOptimizers& optimizers);

}  // namespace gpt
