// Checkpoints of a pipelined model (include/fsdp/pipeline_checkpoint.h): io's save and load of
// one sharded model, each stage one of several in one folder ([Note: one folder, many stages]).
#include <fsdp/pipeline_checkpoint.h>

#include "core/sharded_view.h"
#include "io/async_save.h"
#include "io/pending_save.h"
#include "io/save_snapshot.h"
#include "io/stage_metadata.h"
#include "io/step_folders.h"

#include <sstream>

namespace fsdp::pp {

namespace {

// This rank's stages, each sharded (the same on every rank: thrown before any collective).
std::vector<const Stage*> checkpointed_stages(Pipeline& pipe, const char* what) {
  std::vector<const Stage*> stages;
  for (const Stage& stage : pipe.stages()) {
    TORCH_CHECK(stage.is_sharded(), what, ": stage ", stage.index(), " is not sharded; call "
                "stage.fully_shard(mesh.group(\"dp\")) on every stage before building the Pipeline (a dp "
                "group of one rank too)");
    stages.push_back(&stage);
  }
  return stages;
}

std::vector<ShardedModel> sharded_models(const std::vector<const Stage*>& stages) {
  std::vector<ShardedModel> models;
  for (const Stage* stage : stages) models.push_back(stage->sharded_model());
  return models;
}

// Every stage's parameter names, over `world`.
std::set<std::string> claimed_names(ProcessGroup& world, const std::vector<ShardedModel>& models) {
  std::string mine;
  for (const auto& model : models) {
    for (const auto& p : detail::ShardedView(model).params()) mine += p.name() + "\n";
  }
  std::set<std::string> claimed;
  for (const auto& names : detail::all_gather_strings(world, mine)) {
    std::istringstream lines(names);
    for (std::string name; std::getline(lines, name);) claimed.insert(name);
  }
  return claimed;
}

// The parameters (TensorImpls) of this rank's stages but `but`: the optimizers hold them too.
std::set<const void*> sibling_params(const std::vector<const Stage*>& stages, const Stage* but) {
  std::set<const void*> params;
  for (const Stage* stage : stages) {
    if (stage == but) continue;
    for (const auto& p : detail::ShardedView(stage->sharded_model()).params()) {
      params.insert(p.param().unsafeGetTensorImpl());
    }
  }
  return params;
}

// The snapshot of this rank's stages, one of every stage's in `folder` (collectives over `world`,
// one per stage: every rank holds as many).
detail::SaveSnapshot stages_snapshot(const std::vector<const Stage*>& stages, ProcessGroup& world,
                                     const Optimizers& optimizers, const std::string& folder,
                                     const nlohmann::json& extra) {
  std::vector<detail::SaveSnapshot> snapshots;
  for (const Stage* stage : stages) {
    const ShardedModel model = stage->sharded_model();
    const detail::ShardedView view(model);
    // Stage s's shard files after those of the stages before it: each stage writes one per shard
    // rank and tp rank (take_snapshot's index is shard_rank · T + tp_rank).
    const int first_shard = stage->index() * view.shard_group_size() * detail::agreement_groups(view).tp_size();
    const detail::StageSave save{&world, first_shard, sibling_params(stages, stage)};
    snapshots.push_back(detail::take_snapshot(model, optimizers, folder, extra, &save));
  }
  return detail::join_stage_snapshots(std::move(snapshots));
}

}  // namespace

void save_sharded(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers, const std::string& folder,
                  const nlohmann::json& extra) {
  const auto stages = checkpointed_stages(pipe, "fsdp::pp::save_sharded");
  detail::wait_for_pending_save();
  detail::SaveSnapshot snapshot = stages_snapshot(stages, world, optimizers, folder, extra);
  const std::string error =
      detail::try_local([&] { detail::write_snapshot(snapshot, 0, snapshot.files.size(), {}); });
  detail::complete_snapshot(snapshot, error);
}

std::string save_checkpoint(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers, const std::string& dir,
                            int64_t step, const nlohmann::json& extra, int keep_last) {
  checkpointed_stages(pipe, "fsdp::pp::save_checkpoint");
  const detail::AgreementGroups groups{&world, nullptr};
  const nlohmann::json extra_and_step = detail::extra_with_step(extra, step);
  const std::string name = detail::unpublished_step_folder(groups, dir, step);
  save_sharded(pipe, world, optimizers, dir + "/" + name, extra_and_step);
  detail::publish_step_folder(groups, dir, name, keep_last);
  return dir + "/" + name;
}

AsyncSave save_checkpoint_async(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers,
                                const std::string& dir, int64_t step, const nlohmann::json& extra, int keep_last,
                                const AsyncSaveOptions& options) {
  const auto stages = checkpointed_stages(pipe, "fsdp::pp::save_checkpoint_async");
  const bool pinned = detail::ShardedView(stages.front()->sharded_model()).compute_device().is_cuda();
  return detail::start_async_save(
      {&world, nullptr}, dir, step, extra, keep_last, options, pinned,
      [&](const std::string& folder, const nlohmann::json& extra_and_step) {
        return stages_snapshot(stages, world, optimizers, folder, extra_and_step);
      });
}

nlohmann::json load_sharded(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers,
                            const std::string& folder) {
  const auto models = sharded_models(checkpointed_stages(pipe, "fsdp::pp::load_sharded"));
  const detail::StageLoad scope{&world, claimed_names(world, models)};
  return detail::load_stages(models, optimizers, folder, scope);
}

void reserve_staging_arena(Pipeline& pipe, const Optimizers& optimizers, const AsyncSaveOptions& options) {
  const auto stages = checkpointed_stages(pipe, "fsdp::pp::reserve_staging_arena");
  std::vector<detail::ShardFileContents> files;
  for (const Stage* stage : stages) {
    for (auto& file : detail::local_shard_files(stage->sharded_model(), optimizers)) files.push_back(std::move(file));
  }
  const bool pinned = detail::ShardedView(stages.front()->sharded_model()).compute_device().is_cuda();
  detail::reserve_arena_for(files, pinned, options);
}

// One optimizer: the same.
void save_sharded(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer, const std::string& folder,
                  const nlohmann::json& extra) {
  save_sharded(pipe, world, Optimizers{&optimizer}, folder, extra);
}

std::string save_checkpoint(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                            const std::string& dir, int64_t step, const nlohmann::json& extra, int keep_last) {
  return save_checkpoint(pipe, world, Optimizers{&optimizer}, dir, step, extra, keep_last);
}

AsyncSave save_checkpoint_async(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                                const std::string& dir, int64_t step, const nlohmann::json& extra, int keep_last,
                                const AsyncSaveOptions& options) {
  return save_checkpoint_async(pipe, world, Optimizers{&optimizer}, dir, step, extra, keep_last, options);
}

nlohmann::json load_sharded(Pipeline& pipe, ProcessGroup& world, torch::optim::Optimizer& optimizer,
                            const std::string& folder) {
  return load_sharded(pipe, world, Optimizers{&optimizer}, folder);
}

}  // namespace fsdp::pp
