#pragma once
// [Note: one folder, many stages]
// A pipelined model's checkpoint is one folder, as a whole model's: every stage's ranks write
// their stage's shard files (named by shard index, stage after stage, so that no two clash), the
// agreements span every stage's ranks (the world), and the world's rank 0 writes one
// metadata.json covering every stage: each stage's own rank 0 describes its parameters, buffers
// and param groups, and rank 0 merges those descriptions. Parameters keep the model's own names
// ("h.3.mlp.fc.weight", never a stage's local index), so the folder is the checkpoint of the whole
// model and any layout reads it: another pp or dp degree, none (fsdp::load_sharded), PyTorch's
// dcp.load. A stage loads it by taking the checkpoint's description of its own parameters only
// (restrict_to_model), after every checkpoint parameter was found claimed by some stage.

#include "io/checkpoint_format.h"

#include <fsdp/sharded_model.h>

#include <torch/optim/optimizer.h>

#include <set>
#include <string>
#include <vector>

namespace fsdp::detail {

/// One metadata of the stages' descriptions (to_json of each stage's, "" for ranks that hold
/// none), in rank order: their parameters, buffers and param groups (group k of every stage's
/// optimizer makes group k) together; `world_size` the ranks of all stages.
CheckpointMeta merge_stage_metadata(const std::vector<std::string>& stages, int world_size);

/// The checkpoint as one stage sees it: only the parameters in `params` (their pieces, and their
/// names in the param groups) and the buffers in `buffers`.
CheckpointMeta restrict_to_model(const CheckpointMeta& meta, const std::set<std::string>& params,
                                 const std::set<std::string>& buffers);

/// Throws, naming it and `source`, for a file that two ranks wrote (their stages' shard indices
/// clash: one overwrote the other's).
void check_files_unique(const CheckpointMeta& meta, const std::string& source);

/// Throws, naming it and `source`, for a checkpoint parameter that is not in `claimed` (the
/// parameters of every stage of the loading run): it would be silently left out.
void check_all_claimed(const CheckpointMeta& meta, const std::set<std::string>& claimed, const std::string& source);

/// A stage's load: the agreements span `world` (every stage's ranks), and `claimed` holds the
/// parameters of every stage of the run.
struct StageLoad {
  ProcessGroup* world = nullptr;
  std::set<std::string> claimed;
};

/// fsdp::load_sharded.
nlohmann::json load_model(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                          const std::string& folder);

/// Loads this rank's stages of a pipelined model (each its parameters only; `optimizers` may hold
/// the parameters of all of them): every stage staged and agreed on before any is changed.
/// Collectives over scope.world, one per stage (every rank holds as many). Returns the
/// checkpoint's extra.
nlohmann::json load_stages(const std::vector<ShardedModel>& stages,
                           const std::vector<torch::optim::Optimizer*>& optimizers, const std::string& folder,
                           const StageLoad& scope);

}  // namespace fsdp::detail
