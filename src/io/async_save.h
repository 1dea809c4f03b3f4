#pragma once
// save_checkpoint_async's body (src/io/async_checkpoint.cpp) for any snapshot: one sharded model's
// (fsdp::save_checkpoint_async) or one pipeline stage's of several in one folder
// (fsdp::pp::save_checkpoint_async, src/pp/stage_checkpoint.cpp).

#include "io/checkpoint_agreement.h"
#include "io/save_snapshot.h"

#include <fsdp/async_checkpoint.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fsdp::detail {

/// take_snapshot of the save into `folder` with `extra` (the step added).
using TakeSnapshot = std::function<SaveSnapshot(const std::string& folder, const nlohmann::json& extra)>;

/// Completes the pending save, takes the snapshot into `dir`/step-NNNNNNNN (agreed over `world`),
/// stages it (pinned: in pinned host memory) and starts its background write; a collective.
AsyncSave start_async_save(const AgreementGroups& world, const std::string& dir, int64_t step,
                           const nlohmann::json& extra, int keep_last, const AsyncSaveOptions& options, bool pinned,
                           const TakeSnapshot& take);

/// reserve_staging_arena for a rank whose save stages `files` (several models': a pipeline's
/// stages, local_shard_files of each).
void reserve_arena_for(const std::vector<ShardFileContents>& files, bool pinned, const AsyncSaveOptions& options);

}  // namespace fsdp::detail
