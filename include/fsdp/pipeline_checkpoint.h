#pragma once
/// Checkpoints of a pipelined model (include/fsdp/pipeline.h): one folder for every stage, in the
/// format of fsdp::save_sharded (include/fsdp/checkpoint.h). Every rank writes its stage's shards
/// (each parameter under the model's own name, "h.3.mlp.fc.weight", as boxes of the whole
/// parameter) and the optimizer's state for them; the world's rank 0 writes one metadata.json
/// describing every stage, last, so the folder is complete or has no metadata.json
/// ([Note: one folder, many stages] in src/io/stage_metadata.h). It is the checkpoint of the
/// whole model: it loads into a pipeline of any other pp or dp degree, into the unpipelined
/// model (fsdp::load_sharded), and into PyTorch (torch.distributed.checkpoint's dcp.load).
///
/// Each stage must be sharded (Stage::fully_shard, over a dp group of one rank too; refused by
/// name otherwise). A rank may hold several stages (interleaved 1F1B): `optimizer` holds the
/// parameters of all this rank's stages (pipe.parameters()), and the folder is the one a run of
/// one stage per rank writes of the same model (under ZBV too). Loading reads
/// exactly the parameters (and their optimizer state) of this rank's stages, by name: a parameter
/// of a stage that the checkpoint lacks, or a checkpoint parameter that no stage of the run
/// holds, is refused on every rank, naming it, and nothing is loaded (into any of the rank's
/// stages). All are collectives over `world`, every rank of the pipeline (pp x dp).
///
/// Example:
///   fsdp::pp::Pipeline pipe(stage, mesh.group_ptr("pp"), loss_sum);
///   torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(1e-3));
///   if (auto path = fsdp::latest_checkpoint("ckpt"); !path.empty()) {
///     first_step = fsdp::pp::load_sharded(pipe, *dist->world, optim, path).value("step", int64_t{0});
///   }
///   ... fsdp::pp::save_checkpoint(pipe, *dist->world, optim, "ckpt", step + 1);

#include <fsdp/async_checkpoint.h>
#include <fsdp/checkpoint.h>
#include <fsdp/pipeline.h>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::pp {

/// Several optimizers over one stage's parameters (Muon's matrices and AdamW's rest:
/// fsdp::optim::split_for_muon), each parameter's state under its own optimizer's kinds.
using Optimizers = std::vector<torch::optim::Optimizer*>;

/// fsdp::save_sharded of every stage into `folder`.
void save_sharded(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                  const std::string& folder, const nlohmann::json& extra = nlohmann::json::object());

/// fsdp::save_checkpoint of every stage: `dir`/step-NNNNNNNN, then `dir`/latest names it.
std::string save_checkpoint(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                            const std::string& dir, int64_t step,
                            const nlohmann::json& extra = nlohmann::json::object(), int keep_last = 0);

/// fsdp::save_checkpoint_async of every stage (include/fsdp/async_checkpoint.h): the folder of
/// save_checkpoint above, staged at the step boundary and written by a background thread;
/// wait() (every rank of `world`) publishes it. reserve_staging_arena(pipe, optimizers) below
/// after the first step spares the first save its arena's page faults.
AsyncSave save_checkpoint_async(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                                const std::string& dir, int64_t step,
                                const nlohmann::json& extra = nlohmann::json::object(), int keep_last = 0,
                                const AsyncSaveOptions& options = {});

/// fsdp::load_sharded into this rank's stages: their parameters and optimizer state, from a
/// checkpoint saved at any pp and dp degree, schedule (or none); returns the saved `extra`.
nlohmann::json load_sharded(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                            const std::string& folder);

/// The same four for several optimizers (Optimizers above), as fsdp::save_sharded's overloads.
void save_sharded(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers, const std::string& folder,
                  const nlohmann::json& extra = nlohmann::json::object());
std::string save_checkpoint(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers, const std::string& dir,
                            int64_t step, const nlohmann::json& extra = nlohmann::json::object(), int keep_last = 0);
AsyncSave save_checkpoint_async(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers,
                                const std::string& dir, int64_t step,
                                const nlohmann::json& extra = nlohmann::json::object(), int keep_last = 0,
                                const AsyncSaveOptions& options = {});
nlohmann::json load_sharded(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers,
                            const std::string& folder);

/// fsdp::reserve_staging_arena (include/fsdp/async_checkpoint.h) for save_checkpoint_async of
/// every stage of this rank: one arena for all their shard files. Not a collective.
void reserve_staging_arena(Pipeline& pipe, const Optimizers& optimizers, const AsyncSaveOptions& options = {});

}  // namespace fsdp::pp
