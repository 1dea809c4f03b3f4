#pragma once
// [Note: a save as a snapshot]
// Every save (include/fsdp/checkpoint.h) runs in three phases, shared by the synchronous save and
// the asynchronous one (include/fsdp/async_checkpoint.h):
//   take_snapshot     at the step boundary, on the caller's thread: the agreements, the
//                     metadata's description of the model and optimizer (names, shapes, steps,
//                     param groups) and this rank's shard files' tensors; views of the live
//                     tensors for a synchronous save, copies in a staging arena for an
//                     asynchronous one (stage_snapshot, io/staging_arena.h)
//   write_snapshot    no collective: this rank's shard files (to temporary names, fsynced,
//                     renamed), one file open at a time; an asynchronous save runs it on its
//                     background thread
//   complete_snapshot a collective again: every rank's write agreed on, then rank 0's
//                     metadata.json, written last
// One code path writes every file, so an asynchronous save's folder is a synchronous one's.

#include "io/checkpoint_agreement.h"
#include "io/checkpoint_format.h"

#include <fsdp/checkpoint.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fsdp::detail {

/// The tensors of one shard file: for each box, the parameter's and its optimizer state's views
/// (or staged copies).
struct ShardFileContents {
  NamedTensors tensors;
  nlohmann::json sharding_info = nlohmann::json::object();  // DCP_SHARDING_INFO
  std::vector<PieceMeta> pieces;
};

/// One rank's part of a save, taken at the step boundary.
struct SaveSnapshot {
  AgreementGroups world;
  std::string folder;
  bool writer = false;                      // the first replica's ranks write shard files
  int shard = 0;                            // this rank's index in the shard files' names
  std::vector<ShardFileContents> files;     // this rank's shard files' tensors
  std::vector<std::string> kinds;           // "param", "step", "exp_avg"...
  bool holds_buffers = false;               // rank 0's first file holds the buffers
  bool holds_meta = false;                  // the model's rank 0 describes it in `meta`
  bool of_stage = false;                    // one stage of several ([Note: one folder, many stages])
  std::vector<BufferMeta> buffers;          // their description (file and CRC once written)
  CheckpointMeta meta;                      // everything but the files (rank 0's is written)
  std::string description;                  // the written files, as JSON (write_snapshot's)
};

/// The first phase: checks, agreements, and this rank's files as views of the live tensors.
/// A collective; every rank throws if any rank failed. Creates `folder` and removes an old
/// metadata.json from it. `stages_world`: when the model is one pipeline stage of several saved
/// into one folder, the group of every stage's ranks, which then agrees on every phase and whose
/// rank 0 writes the metadata of all of them ([Note: one folder, many stages]).
SaveSnapshot take_snapshot(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                           const std::string& folder, const nlohmann::json& extra,
                           ProcessGroup* stages_world = nullptr);

/// This rank's shard files as take_snapshot would stage them now (views of the live tensors; no
/// collective, nothing created): empty on a rank that writes none.
std::vector<ShardFileContents> local_shard_files(const ShardedModel& model,
                                                 const std::vector<torch::optim::Optimizer*>& optimizers);

/// Writes the shard files [first, last) of this rank's snapshot (no collective) and adds their
/// description to snapshot.description; `hooks.after_shard_files` runs once the last one is.
void write_snapshot(SaveSnapshot& snapshot, size_t first, size_t last, const SaveHooks& hooks);

/// The last phase: `write_error` (this rank's, "" when it wrote) agreed on, then rank 0's
/// metadata.json. A collective; every rank throws if any rank failed.
void complete_snapshot(SaveSnapshot& snapshot, const std::string& write_error);

}  // namespace fsdp::detail
