#pragma once
/// Sharded checkpoints: every rank writes its own pieces of the parameters and of the optimizer's
/// state (any of torch::optim's SGD, Adam, AdamW, RMSprop, Adagrad, and fsdp::optim's AdamW, SGD
/// and Muon: each state tensor in pieces, each step count as a scalar), and rank 0 the model's buffers
/// whole (BatchNorm's running statistics: rank 0's values, as sync_buffers gives every rank);
/// rank 0 writes one metadata file that describes every piece as (parameter name, global shape,
/// element range [begin, end) of the flattened parameter). The description names no rank and no
/// flat buffer, so any layout reads any other: a checkpoint saved by W ranks loads on W' ranks, or
/// under another sharding strategy, and gives the same parameters and optimizer state.
///
/// One checkpoint is a folder of safetensors files that PyTorch reads as they are:
///   shard-00000-model-00001-of-00003.safetensors   shard 0's pieces, as boxes of the full tensors
///   shard-00000-model-00002-of-00003.safetensors     (a range of a matrix's elements is up to 3
///   ...                                              boxes: [Note: boxes of a flat shard]), each
///                                                    file's __metadata__ holding DCP_SHARDING_INFO
///                                                    (every box's offsets in the full tensor);
///                                                    tensors named as in the model ("wte.weight")
///                                                    and as torch.distributed.checkpoint names an
///                                                    optimizer's ("state.wte.weight.exp_avg",
///                                                    "state.fc.weight.momentum_buffer",
///                                                    "state.wte.weight.step"); buffers whole
///                                                    under their names ("bn.running_mean"), in
///                                                    shard 0's first file
///   metadata.json                                  written last, so a folder without it is
///                                                    incomplete: names, shapes, dtypes, the
///                                                    optimizer's class and steps, the buffers,
///                                                    each file's size and pieces with the
///                                                    CRC-32 of each tensor, the param groups'
///                                                    options, and the caller's own JSON
///                                                    ("extra": the step, the seed...)
/// A model parallelized over a tensor-parallel group (fsdp/parallelize.h) before fully_shard
/// saves its pieces as boxes of the WHOLE parameters (each tp rank's part moved to where it lies;
/// a row-wise weight's part, a column block, recorded as a box), parameters replicated over the
/// tp ranks once (tp rank 0's), and loads at any other (dp, tp) layout or none: the agreements
/// span the FSDP and the tensor-parallel groups together ([Note: boxes of a tensor-parallel
/// part] in src/io/global_boxes.h; docs/api.md).
/// A pipelined model's stages save into one such folder and load from any other layout's
/// (include/fsdp/pipeline_checkpoint.h).
/// In Python, torch.distributed.checkpoint.load(state_dict,
/// storage_reader=HuggingFaceStorageReader(folder)) fills full tensors (no_dist=True) or the
/// DTensors of a PyTorch FSDP2 model at any world size; safetensors.safe_open opens every file.
/// A checkpoint directory holds one folder per step and a pointer to the newest complete one,
/// written (atomically) only after that folder is complete:
///   latest                   "step-00000020"
///   step-00000010/  step-00000020/
/// Every file is written to a temporary name, fsynced and renamed, so a save killed at any moment
/// leaves the previous checkpoint the one that `latest` names, intact.
///
/// Loading checks everything first (the metadata against the model, each needed file's size and
/// CRC-32, each piece's name and shape) on every rank, and copies nothing unless every rank
/// succeeded: otherwise every rank throws the same error, naming the rank, the file and the cause.
///
/// Save and load are collectives: every rank calls them, between steps (not during a forward or
/// a backward). A unit a forward left unsharded for a backward that has not started (or never
/// will: an evaluation without NoGradGuard) is resharded first, as PyTorch FSDP2 does before a
/// state dict; that backward, if it comes, gathers it again. Each param group's options (every option of its class: lr, betas, eps,
/// weight_decay, amsgrad, momentum, dampening, nesterov, alpha, centered, lr_decay,
/// initial_accumulator_value) are saved in metadata.json's "param_groups", as
/// torch.distributed.checkpoint's optimizer state dict holds them ({"params": ["fc.weight", ...],
/// "lr": ...}), and loading restores them, as torch::load of a torch::save'd optimizer does: a
/// resumed run continues at the learning rate its schedule had reached, whatever options the
/// program built its optimizer with. The loading optimizer must be of the same class (a
/// checkpoint of SGD's state does not load into an Adam; to switch, load with the saved class,
/// then build the new optimizer over model->parameters(), which starts afresh) and have the same
/// number of param groups, each holding the same parameters: otherwise loading throws, naming
/// both counts or the parameter. A checkpoint saved before the options were (no "param_groups")
/// loads and keeps the program's options. The optimizer must hold parameters of the model only:
/// a tensor outside it (its state could not be saved) is refused at the save, naming its group,
/// position and shape, before anything is written. A buffer must match the model's in name, shape and
/// dtype, as a parameter does. An optimizer of another class (LBFGS, one of the program's own) is refused by
/// name at the first save. A checkpoint saved before buffers were saved (no "buffers" in
/// metadata.json) still loads: the model's buffers then keep their values.
///
/// Several optimizers over one model (Muon for the hidden matrices, AdamW for the rest) save into
/// one checkpoint with the overloads taking `const std::vector<torch::optim::Optimizer*>&`: the
/// union of their per-parameter state under DCP's names, as torchtitan's OptimizersContainer
/// saves it, each parameter recorded with the class of the optimizer that held it, and every
/// optimizer's param groups (with their options: lr...). Every parameter may be in one optimizer
/// at most (one in two is refused, naming it). Loading gives each parameter's state to the
/// optimizer that holds it now; a parameter whose saved state is of another class (Muon's
/// momentum into an AdamW, or the reverse) is refused, naming the parameter and both classes. Pass
/// the optimizers in the order the saved run did ([Note: several optimizers, one checkpoint] in
/// src/io/optimizer_set.h).
///   auto split = fsdp::optim::split_for_muon(*model);
///   fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
///   fsdp::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(3e-4));
///   fsdp::save_checkpoint(model, {&muon, &adamw}, "ckpt", step);
///   ... fsdp::load_sharded(model, {&muon, &adamw}, fsdp::latest_checkpoint("ckpt"));
///
/// Example:
///   auto model = fsdp::fully_shard(Net(), *dist->world);
///   torch::optim::AdamW optim(model->parameters(), torch::optim::AdamWOptions(1e-3));
///   int64_t first_step = 0;
///   if (auto path = fsdp::latest_checkpoint("ckpt"); !path.empty()) {
///     first_step = fsdp::load_sharded(model, optim, path).value("step", int64_t{0});
///   }
///   for (int64_t step = first_step; step < steps; ++step) {
///     train_step(model, optim, step);
///     if ((step + 1) % 100 == 0) {
///       fsdp::save_checkpoint(model, optim, "ckpt", step + 1);  // records "step" in extra
///     }
///   }

#include <fsdp/fully_shard.h>
#include <fsdp/state_dict.h>
#include <fsdp/tensor_file.h>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fsdp {

/// The largest metadata.json that loading reads; a larger one is refused unread (it would take
/// minutes and gigabytes to parse). A real one holds ~250 bytes per box, up to 3 boxes per piece
/// and about units x (ranks + parameters per unit) pieces: 1024 ranks x 100 units is ~80 MB.
constexpr int64_t kMaxMetadataBytes = int64_t{256} << 20;

/// A test seam of save_sharded and save_checkpoint: code run at a chosen moment of a save.
struct SaveHooks {
  /// Runs on every rank that writes shard files, before the first (an asynchronous save's on its
  /// background thread, once staged): tests hold a save there while training goes on.
  std::function<void()> before_shard_files;
  /// Runs on every rank that writes shard files, once they are written and before the
  /// metadata.json that completes the folder: tests stall a save there to kill it half-way.
  std::function<void()> after_shard_files;
};

/// Writes one checkpoint into `folder` (created if needed): this rank's shard file, then rank 0's
/// metadata.json with `extra` (any JSON: the step, the seed...). A collective; every rank throws
/// if any rank could not write. `hooks`: for tests (SaveHooks).
///
/// Example:
///   fsdp::save_sharded(model, optim, "ckpt/final", {{"step", 1000}});
void save_sharded(const ShardedModel& model, torch::optim::Optimizer& optimizer, const std::string& folder,
                  const nlohmann::json& extra = nlohmann::json::object(), const SaveHooks& hooks = {});
/// The same for several optimizers over one model (Muon and AdamW), each parameter in one of them.
void save_sharded(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                  const std::string& folder, const nlohmann::json& extra = nlohmann::json::object(),
                  const SaveHooks& hooks = {});

/// Loads the checkpoint in `folder` (saved by any number of ranks, any strategy) into the model
/// and `optimizer` (built over model->parameters(), of the class that saved it, with the same
/// param groups; their options become the saved ones), and returns the `extra` JSON it was saved
/// with (from save_checkpoint: with its "step"). Validates on every rank before it copies anything: a missing, truncated or
/// corrupt file, or a checkpoint of another model, throws on every rank and changes nothing.
///
/// Example:
///   int64_t step = fsdp::load_sharded(model, optim, "ckpt/final").at("step");
nlohmann::json load_sharded(const ShardedModel& model, torch::optim::Optimizer& optimizer,
                            const std::string& folder);
/// The same for several optimizers: each parameter's state goes to the optimizer holding it now,
/// which must be of the class that saved it; pass the optimizers as the saved run did (the same
/// classes in the same order, the same param groups).
nlohmann::json load_sharded(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                            const std::string& folder);

/// Saves into `dir`/step-NNNNNNNN (save_sharded), `extra` (a JSON object) with "step": `step`
/// added (an extra.step of another value throws), then publishes it as `dir`/latest. With
/// keep_last > 0, removes older step folders so that the newest `keep_last` remain (a step folder
/// that holds anything a save does not write, such as another run's folder, is kept, with a
/// warning). Returns the
/// folder. Saving the step that `latest` already names again throws (it would overwrite the only
/// complete checkpoint in place). `hooks`: for tests (SaveHooks).
///
/// Example:
///   fsdp::save_checkpoint(model, optim, "ckpt", step, {{"seed", seed}}, /*keep_last=*/2);
std::string save_checkpoint(const ShardedModel& model, torch::optim::Optimizer& optimizer,
                            const std::string& dir, int64_t step,
                            const nlohmann::json& extra = nlohmann::json::object(),
                            int keep_last = 0, const SaveHooks& hooks = {});
/// The same for several optimizers over one model (save_sharded's).
std::string save_checkpoint(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                            const std::string& dir, int64_t step,
                            const nlohmann::json& extra = nlohmann::json::object(),
                            int keep_last = 0, const SaveHooks& hooks = {});

/// The folder of the newest complete checkpoint in `dir` (the one `dir`/latest names), or ""
/// when there is none yet (no `dir`, or no save was ever published). Not a collective.
/// Without `latest`, the newest step folder that holds its metadata.json. A `latest` that is not
/// what save_checkpoint writes throws, naming it and the rule, rather than being ignored (which
/// would resume from another step): a link, a FIFO or anything but a regular file, over 4 KiB, or
/// a text other than "step-N" (N of 1 to 18 digits) and one optional newline, or a step folder
/// that a link puts outside `dir`.
///
/// Example:
///   if (auto path = fsdp::latest_checkpoint("ckpt"); !path.empty()) fsdp::load_sharded(...);
std::string latest_checkpoint(const std::string& dir);

/// Throws unless `dir` can be a checkpoint directory of its own: no folder above it is one, and
/// none below it (a few levels deep) is another run's. A checkpoint directory is a folder holding
/// `latest`, `run.lock` or step folders (step-NNNNNNNN); one run's saves and pruning would take
/// the other's files for their own (a `dir` inside another run's step folder is deleted when that
/// run prunes the folder). Not a collective; call it before anything is written into `dir`.
///
/// Example:
///   fsdp::check_checkpoint_dir_alone("runs/a");  // throws if runs/ is a checkpoint directory
void check_checkpoint_dir_alone(const std::string& dir);

/// The optimizer state of every parameter, unsharded, on every rank (a collective), under the
/// names torch.distributed.checkpoint gives an optimizer's state: "state.NAME.exp_avg",
/// "state.NAME.exp_avg_sq" (and "state.NAME.max_exp_avg_sq"), SGD's "state.NAME.momentum_buffer",
/// ... in the parameter's shape, and "state.NAME.step" as a 0-d int64 tensor (optimizers that
/// count steps); parameters without state (never stepped) are left out.
///
/// Example:
///   for (auto& [key, tensor] : fsdp::gather_full_optimizer_state(model, optim)) ...
NamedTensors gather_full_optimizer_state(const ShardedModel& model, torch::optim::Optimizer& optimizer);
/// The same for several optimizers over one model: the union of their state (Muon's
/// "state.NAME.momentum_buffer" beside AdamW's "state.NAME.exp_avg"...).
NamedTensors gather_full_optimizer_state(const ShardedModel& model,
                                         const std::vector<torch::optim::Optimizer*>& optimizers);

}  // namespace fsdp
