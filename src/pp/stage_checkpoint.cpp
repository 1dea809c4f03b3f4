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

// This rank's only stage, sharded (the same on every rank: thrown before any collective).
const Stage& checkpointed_stage(Pipeline& pipe, const char* what) {
  TORCH_CHECK(pipe.stages().size() == 1, what, ": this rank holds ", pipe.stages().size(),
              " stages; a checkpoint of several stages per rank (interleaved-1f1b, zbv) is not "
              "written yet: use one stage per rank (gpipe, 1f1b)");
  const Stage& stage = pipe.stages().front();
  TORCH_CHECK(stage.is_sharded(), what, ": stage ", stage.index(), " is not sharded; call "
              "stage.fully_shard(mesh.group(\"dp\")) before building the Pipeline (a dp group of one "
              "rank too)");
  return stage;
}

// Every stage's parameter names, over `world`.
std::set<std::string> claimed_names(ProcessGroup& world, const ShardedModel& model) {
  std::string mine;
  for (const auto& p : detail::ShardedView(model).params()) mine += p.name() + "\n";
  std::set<std::string> claimed;
  for (const auto& names : detail::all_gather_strings(world, mine)) {
    std::istringstream lines(names);
    for (std::string name; std::getline(lines, name);) claimed.insert(name);
  }
  return claimed;
}

// The snapshot of this rank's stage, one of every stage's in `folder` (a collective over `world`).
detail::SaveSnapshot stage_snapshot(const Stage& stage, ProcessGroup& world, const Optimizers& optimizers,
                                    const std::string& folder, const nlohmann::json& extra) {
  const ShardedModel model = stage.sharded_model();
  detail::SaveSnapshot snapshot = detail::take_snapshot(model, optimizers, folder, extra, &world);
  // Stage s's shard files after those of the stages before it: each stage writes one per shard
  // rank and tp rank (take_snapshot's index is shard_rank · T + tp_rank).
  const detail::ShardedView view(model);
  snapshot.shard += stage.index() * view.shard_group_size() * detail::agreement_groups(view).tp_size();
  return snapshot;
}

}  // namespace

void save_sharded(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers, const std::string& folder,
                  const nlohmann::json& extra) {
  const Stage& stage = checkpointed_stage(pipe, "fsdp::pp::save_sharded");
  detail::wait_for_pending_save();
  detail::SaveSnapshot snapshot = stage_snapshot(stage, world, optimizers, folder, extra);
  const std::string error =
      detail::try_local([&] { detail::write_snapshot(snapshot, 0, snapshot.files.size(), {}); });
  detail::complete_snapshot(snapshot, error);
}

std::string save_checkpoint(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers, const std::string& dir,
                            int64_t step, const nlohmann::json& extra, int keep_last) {
  checkpointed_stage(pipe, "fsdp::pp::save_checkpoint");
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
  const Stage& stage = checkpointed_stage(pipe, "fsdp::pp::save_checkpoint_async");
  const bool pinned = detail::ShardedView(stage.sharded_model()).compute_device().is_cuda();
  return detail::start_async_save(
      {&world, nullptr}, dir, step, extra, keep_last, options, pinned,
      [&](const std::string& folder, const nlohmann::json& extra_and_step) {
        return stage_snapshot(stage, world, optimizers, folder, extra_and_step);
      });
}

nlohmann::json load_sharded(Pipeline& pipe, ProcessGroup& world, const Optimizers& optimizers,
                            const std::string& folder) {
  const ShardedModel model = checkpointed_stage(pipe, "fsdp::pp::load_sharded").sharded_model();
  const detail::StageLoad stage{&world, claimed_names(world, model)};
  return detail::load_model(model, optimizers, folder, &stage);
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
