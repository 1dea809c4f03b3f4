// The metadata of a checkpoint of several pipeline stages ([Note: one folder, many stages]).
#include "io/stage_metadata.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp::detail {

namespace {

// Group k of `from` joins group k of `into` (one optimizer class over every stage).
void merge_param_groups(std::vector<ParamGroupMeta>& into, const std::vector<ParamGroupMeta>& from) {
  TORCH_CHECK(into.size() == from.size(), "save_sharded: the stages' optimizers have ", into.size(), " and ",
              from.size(), " param groups: build every stage's optimizer with the same param groups");
  for (size_t k = 0; k < into.size(); ++k) {
    into[k].params.insert(into[k].params.end(), from[k].params.begin(), from[k].params.end());
  }
}

}  // namespace

CheckpointMeta merge_stage_metadata(const std::vector<std::string>& stages, int world_size) {
  CheckpointMeta merged;
  bool first = true;
  for (size_t r = 0; r < stages.size(); ++r) {
    if (stages[r].empty()) continue;
    CheckpointMeta stage = parse_metadata(stages[r], "rank " + std::to_string(r) + "'s stage");
    if (first) {
      merged = std::move(stage);
      first = false;
      continue;
    }
    TORCH_CHECK(stage.optimizers == merged.optimizers, "save_sharded: rank ", r, "'s stage is trained by ",
                stage.optimizer, " and rank 0's by ", merged.optimizer, ": every stage needs the same optimizers");
    merged.params.insert(merged.params.end(), stage.params.begin(), stage.params.end());
    if (stage.buffers) {
      if (!merged.buffers) merged.buffers.emplace();
      merged.buffers->insert(merged.buffers->end(), stage.buffers->begin(), stage.buffers->end());
    }
    if (stage.param_groups && merged.param_groups) merge_param_groups(*merged.param_groups, *stage.param_groups);
  }
  merged.world_size = world_size;
  return merged;
}

CheckpointMeta restrict_to_model(const CheckpointMeta& meta, const std::set<std::string>& params,
                                 const std::set<std::string>& buffers) {
  CheckpointMeta mine = meta;
  auto erase_unless = [](auto& items, auto&& keep) {
    items.erase(std::remove_if(items.begin(), items.end(), [&](const auto& item) { return !keep(item); }),
                items.end());
  };
  erase_unless(mine.params, [&](const ParamMeta& p) { return params.count(p.name) > 0; });
  for (auto& file : mine.files) {
    erase_unless(file.pieces, [&](const PieceMeta& p) { return params.count(p.param) > 0; });
  }
  if (mine.buffers) erase_unless(*mine.buffers, [&](const BufferMeta& b) { return buffers.count(b.name) > 0; });
  if (mine.param_groups) {
    for (auto& group : *mine.param_groups) {
      erase_unless(group.params, [&](const std::string& name) { return params.count(name) > 0; });
    }
  }
  return mine;
}

void check_files_unique(const CheckpointMeta& meta, const std::string& source) {
  std::set<std::string> seen;
  for (const auto& file : meta.files) {
    TORCH_CHECK(seen.insert(file.name).second, source, ": two stages wrote ", file.name,
                " (on two ranks, or on one rank holding both: their shard files share a name): a "
                "stage's shard index must follow the stages before it");
  }
}

void check_all_claimed(const CheckpointMeta& meta, const std::set<std::string>& claimed, const std::string& source) {
  for (const auto& p : meta.params) {
    TORCH_CHECK(claimed.count(p.name), source, " has parameter '", p.name, "' that no stage of this run holds: "
                "load a checkpoint of this model (its parameters under the model's own names) into "
                "stages that together hold every parameter");
  }
}

}  // namespace fsdp::detail
