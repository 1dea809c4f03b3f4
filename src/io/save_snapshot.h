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

#include <set>
#include <string>
#include <vector>

namespace fsdp::detail {

/// The tensors of one shard file: for each box, the parameter's and its optimizer state's views
/// (or staged copies).
struct ShardFileContents {
  std::string name;  // shard_file_name's
  NamedTensors tensors;
  nlohmann::json sharding_info = nlohmann::json::object();  // DCP_SHARDING_INFO
  std::vector<PieceMeta> pieces;
};

/// One rank's part of a save, taken at the step boundary.
struct SaveSnapshot {
  AgreementGroups world;
  std::string folder;
  bool writer = false;                      // the first replica's ranks write shard files
  std::vector<ShardFileContents> files;     // this rank's shard files' tensors
  std::vector<std::string> kinds;           // "param", "step", "exp_avg"...
  bool holds_buffers = false;               // rank 0's first file holds the buffers
  bool holds_meta = false;                  // the model's rank 0 (a stage's: of some stage) describes it in `meta`
  bool of_stage = false;                    // one stage of several ([Note: one folder, many stages])
  std::vector<BufferMeta> buffers;          // their description (file and CRC once written)
  CheckpointMeta meta;                      // everything but the files (rank 0's is written)
  std::string description;                  // the written files, as JSON (write_snapshot's)
};

/// A model that is one pipeline stage of several saved into one folder ([Note: one folder, many
/// stages]).
struct StageSave {
  ProcessGroup* world = nullptr;  // every stage's ranks: agrees on every phase, its rank 0 writes the metadata
  int first_shard = 0;            // the shard index of the stage's first shard files (after the stages before)
  std::set<const void*> siblings;  // the parameters (TensorImpls) of this rank's other stages, which the
                                   // optimizers hold too: their own stage's snapshot saves them
};

/// The first phase: checks, agreements, and this rank's files as views of the live tensors.
/// A collective; every rank throws if any rank failed. Creates `folder` and removes an old
/// metadata.json from it. `stage`: when the model is one pipeline stage of several.
SaveSnapshot take_snapshot(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                           const std::string& folder, const nlohmann::json& extra, const StageSave* stage = nullptr);

/// The snapshots of this rank's stages (each take_snapshot's, in stage order, one folder) as one:
/// their files, buffers and descriptions together, so that one write and one complete_snapshot
/// save them all (a rank holding several stages: interleaved-1f1b).
SaveSnapshot join_stage_snapshots(std::vector<SaveSnapshot> stages);

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
