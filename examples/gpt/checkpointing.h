#pragma once
// gpt_train's files: every path a run reads or writes checked before any work, its sharded
// checkpoints (saved, found and resumed, their metadata read with checks), and what it writes of
// the trained model (--save-full, --export-hf).

#include "gpt.h"
#include "options.h"
#include "train_optimizers.h"

#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>
#include <fsdp/run_lock.h>
#include <fsdp/state_dict.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace gpt {

// Every file and folder a gpt_train run reads or writes, checked before any work: inputs exist
// and can be read to an end, outputs can be written, and no output is an input (or inside an
// input folder, or holds one): a run never overwrites what it reads.
/// `path` with every "{rank}" replaced by `rank` (per-rank outputs: --metrics, --trace).
std::string for_rank(std::string path, int rank);

/// Checks the paths of `o` for this process (`rank` of `world_size`; the reference: 0 of 1).
/// Not a collective: every rank checks its own per-rank outputs and the shared inputs. Throws a
/// message naming the flag, the path, the rule and the fix.
void check_paths(const TrainOptions& o, int rank, int world_size);

// What a gpt_train checkpoint's metadata.json says of its run, read with checks: "extra" (the
// step to continue from, the seed) and each parameter's AdamW step. An edited checkpoint whose
// CRC-32s were recomputed passes every checksum, so what it says must also make sense: a field
// missing, mistyped or out of range, a step that disagrees with its folder's name or with AdamW's,
// a trained parameter without its optimizer's state are refused, naming the file, the field and
// the fix.
/// extra.step of `metadata` (the path of a metadata.json, for the message): an integer >= 0.
int64_t saved_step(const nlohmann::json& extra, const std::string& metadata);

/// extra.seed of `metadata`: an integer that --seed accepts (0 to 2^63 - 1).
uint64_t saved_seed(const nlohmann::json& extra, const std::string& metadata);

/// extra.tp of the parsed metadata.json `meta` (1 when saved before --tp): an integer dividing the
/// saved world size, equal to the checkpoint's own tp_size. Any --tp resumes it (the checkpoint
/// holds boxes of the whole parameters: fsdp/checkpoint.h).
int saved_tp(const nlohmann::json& meta, const std::string& metadata);

/// Before loading the checkpoint `folder` (its parsed metadata.json `meta`): extra.step is the
/// folder's number (step-NNNNNNNN), and every parameter this run trains (not --freeze) has its
/// optimizer's state: AdamW's with a step from 1 to extra.step, Muon's (its "optimizer" in
/// metadata.json, --optimizer muon) its momentum; unless o.reset_optimizer, which asks for the
/// parameters alone. Throws naming metadata.json, the parameter or field, and the fix.
void check_saved_state(const nlohmann::json& meta, const std::string& folder, const TrainOptions& o);

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

/// After step `step` (0-based) has been trained: every `every` steps, and after the last step,
/// saves a checkpoint that resumes at step + 1 (keeping the newest two). No-op when every <= 0.
///
/// Example:
///   save_checkpoint_if_due(model, optimizers, dir, o.save_every, step, o);
void save_checkpoint_if_due(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
                            const std::string& dir, int64_t every, int64_t step,
                            const TrainOptions& o);

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
