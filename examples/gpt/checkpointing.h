#pragma once
// gpt_train's files: every path a run reads or writes checked before any work, its sharded
// checkpoints (saved, found and resumed, their metadata read with checks), and what it writes of
// the trained model (--save-full, --export-hf).

#include "gpt.h"
#include "run_paths.h"
#include "saved_metadata.h"
#include "options.h"
#include "train_optimizers.h"

#include <fsdp/distributed.h>
#include <fsdp/checkpoint.h>
#include <fsdp/fully_shard.h>
#include <fsdp/run_lock.h>
#include <fsdp/state_dict.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace gpt {

// gpt_train's checkpoints: --save-every N --checkpoint-dir DIR --resume. Sharded checkpoints
// (fsdp/checkpoint.h) in DIR/step-NNNNNNNN, DIR/latest naming the newest complete one. The data
// position is the step: the global batch of a step is a pure function of (data, seed, step), so
// resuming at step s trains on exactly the batches the uninterrupted run would have.
/// Rank 0 (else nullptr): holds --checkpoint-dir for this run (fsdp::RunLock, DIR/run.lock),
/// so that a second run into the same folder is refused at once, naming this one. A folder that
/// exists is locked whether `create` or not; a missing one (that the run saves into) only with
/// `create`, which creates it: a run refused before then (the rendezvous, --auto's choice)
/// leaves no folder behind. Also nullptr when there is no --checkpoint-dir. First refuses a
/// folder inside another run's checkpoint folder or holding one (fsdp::check_checkpoint_dir_alone).
/// Prints a line when it takes over the lock of a run that died holding it.
std::unique_ptr<fsdp::RunLock> lock_checkpoint_dir(const TrainOptions& o, int rank, bool create);

/// --checkpoint-dir consistent with --resume (rank 0, under the lock): a fresh run refuses a
/// folder that holds another run's checkpoints (no silent overwrite), --resume refuses a missing
/// folder, a file, a folder without checkpoints (unless --resume auto), and a checkpoint of
/// another model or seed. Throws a message naming the flag and the fix.
void check_checkpoint_dir(const TrainOptions& o);

/// Rank 0, before training: removes temporary files that a killed save left behind (name.tmp.PID
/// of a process that no longer exists) and creates --checkpoint-dir when the run saves.
void prepare_checkpoint_dir(const TrainOptions& o, int rank);

/// True when step `step` (0-based) ends with a checkpoint (every N steps and after the last).
bool checkpoint_due(const TrainOptions& o, int64_t step);

/// Loads the newest checkpoint in `dir` into the model and optimizers and returns the step to
/// continue from; 0 when `dir` holds none yet and o.resume_if_none (prints so). Throws if the checkpoint was trained
/// with another seed (other batches) and names both. `rank` 0 prints what it loaded.
///
/// Example:
///   const int64_t first_step = o.resume ? resume_from_checkpoint(model, optimizers, dir, o, rank)
///                                    : 0;
int64_t resume_from_checkpoint(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
                               const std::string& dir, const TrainOptions& o, int rank);

/// --async-save: the staging arena made and faulted in on a background thread now, after the
/// run's first step (the optimizer's state exists), so that the first save stalls for the copy
/// alone (fsdp::reserve_staging_arena). No-op without --async-save.
void reserve_async_staging(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers, const TrainOptions& o);

/// After step `step` (0-based) has been trained: every `every` steps, and after the last step,
/// saves a checkpoint that resumes at step + 1 (keeping the newest two). No-op when every <= 0.
///
/// Example:
///   save_checkpoint_if_due(model, optimizers, dir, o.save_every, step, o);
void save_checkpoint_if_due(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
                            const std::string& dir, int64_t every, int64_t step,
                            const TrainOptions& o);

/// How a model that is not one fsdp::Unit (a pipeline's stages) loads the checkpoint folder
/// `path` (returning its extra), and saves step `next_step` with `extra` into --checkpoint-dir.
using LoadCheckpoint = std::function<nlohmann::json(const std::string& path)>;
using SaveCheckpoint = std::function<void(int64_t next_step, const nlohmann::json& extra, const fsdp::SaveHooks& hooks)>;

/// resume_from_checkpoint, loading with `load`.
int64_t resume_with(const LoadCheckpoint& load, TrainOptimizers& optimizers, const std::string& dir,
                    const TrainOptions& o, int rank);

/// save_checkpoint_if_due, saving with `save`.
void save_if_due_with(const SaveCheckpoint& save, TrainOptimizers& optimizers, const std::string& dir,
                      int64_t every, int64_t step, const TrainOptions& o);

// What gpt_train writes of the trained model: --save-full (rank 0, the full parameters as a
// torch.save dict) and --export-hf (rank 0, a transformers GPT-2 folder), and the full parameters
// that gpt::train returns.
/// Writes the full parameters to o.save_full (a collective when sharded: rank 0 writes).
void save_full(const TrainOptions& o, fsdp::Unit<GPT>& model, fsdp::Distributed* dist);

/// The full parameters under their original names, on every rank (a copy, detached).
fsdp::NamedTensors full_params(fsdp::Unit<GPT>& model, fsdp::Distributed* dist);

/// --export-hf: rank 0 writes the folder; every rank learns whether it could, and throws if not.
void export_hf(const TrainOptions& o, const fsdp::NamedTensors& full_params,
               fsdp::Distributed* dist);

}  // namespace gpt
