// Saving a sharded checkpoint (include/fsdp/checkpoint.h): each writing rank's pieces of the
// parameters and of the optimizer's state to its shard files (rank 0's first also the model's
// buffers, whole), then metadata.json, written last by rank 0 ([Note: checkpoint agreement]
// between the phases; [Note: a save as a snapshot] for the phases themselves).
#include <fsdp/checkpoint.h>
#include <fsdp/safetensors.h>

#include "io/checkpoint_agreement.h"
#include "io/checkpoint_pieces.h"
#include "io/global_boxes.h"
#include "io/param_groups.h"
#include "io/pending_save.h"
#include "io/save_snapshot.h"
#include "io/stage_metadata.h"
#include "io/tp_replica_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <map>

namespace fsdp::detail {

namespace {

namespace fs = std::filesystem;

const std::set<const void*> kNoSiblings;

// torch.distributed.checkpoint's HuggingFaceStorageReader reads a box's place in the full tensor
// from the file's __metadata__: {"DCP_SHARDING_INFO": "{KEY: {\"saved_offsets\": [...]}}"}.
void add_box(ShardFileContents& contents, const std::string& key, const at::Tensor& data,
             const std::vector<int64_t>& offsets) {
  contents.tensors.emplace_back(key, data);
  contents.sharding_info[key] = {{"saved_offsets", offsets}};
}

// Splits this rank's pieces into boxes of the whole parameters ([Note: boxes of a flat shard],
// [Note: boxes of a tensor-parallel part]); shard file k holds the k-th box of every piece. A
// parameter replicated over the tensor-parallel ranks is saved once, by tp rank 0's ranks. The
// optimizer's step goes, as a 0-d float ("state.NAME.step", as PyTorch's optimizers keep it), with
// the box that starts the whole parameter.
std::vector<ShardFileContents> shard_files_contents(const ShardedView& model, const OptimizerSet& optimizers,
                                                    const AgreementGroups& groups) {
  std::vector<ShardFileContents> files;
  for (const auto& piece : local_pieces(model)) {
    const PartInWhole part = part_in_whole(piece);
    if (part.dim < 0 && groups.tp_rank() != 0) continue;  // tp rank 0 saves the replicated ones
    const auto saved = optimizers.read(piece.param());
    const auto boxes = boxes_in_whole(piece.shape(), piece.begin(), piece.end(), part);
    if (files.size() < boxes.size()) files.resize(boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k) {
      const PlacedBox& box = boxes[k];
      ShardFileContents& contents = files[k];
      auto view = [&](const at::Tensor& flat) { return box.view_in(flat, piece.begin()).contiguous(); };
      add_box(contents, tensor_key("param", piece.name()), view(piece.data()), box.offsets);
      PieceMeta meta{piece.name(), 0, 0, {}, {}, {}};
      if (!box_is_range(part.whole_shape, box.offsets, box.sizes, meta.begin, meta.end)) {
        meta.offsets = box.offsets;  // a column block: recorded as the box it is
        meta.sizes = box.sizes;
      }
      contents.pieces.push_back(std::move(meta));
      if (!saved) continue;
      for (const auto& [kind, tensor] : saved->tensors) {
        add_box(contents, tensor_key(kind, piece.name()), view(tensor.reshape({-1})), box.offsets);
      }
      const bool starts_whole = std::all_of(box.offsets.begin(), box.offsets.end(), [](int64_t o) { return o == 0; });
      if (starts_whole && saved->step) {
        add_box(contents, tensor_key("step", piece.name()),
                at::scalar_tensor(static_cast<double>(*saved->step), at::kFloat), {});
      }
    }
  }
  return files;
}

// Rank 0's buffers, whole (their offsets all 0 in DCP_SHARDING_INFO), join its first file.
void add_buffers(ShardFileContents& contents, const NamedTensors& buffers) {
  for (const auto& [name, buffer] : buffers) {
    add_box(contents, name, buffer.detach().to(at::kCPU).contiguous(),
            std::vector<int64_t>(buffer.dim(), 0));
  }
}

// Everything metadata.json says but the files: written by rank 0 once every rank wrote.
CheckpointMeta metadata_without_files(const ShardedView& model, const OptimizerSet& optimizers,
                                      const AgreementGroups& groups,
                                      const std::vector<ParamGroupMeta>& param_groups,
                                      const nlohmann::json& extra) {
  CheckpointMeta meta;
  meta.optimizer = optimizers.name();
  meta.optimizers = optimizers.names();
  meta.param_groups = param_groups;
  meta.world_size = groups.size();
  meta.tp_size = groups.tp_size();
  meta.shard_group_size = model.shard_group_size();
  meta.strategy = to_string(model.options().strategy());
  meta.params = describe_model(model, optimizers);
  meta.extra = extra;
  return meta;
}

// This rank's shard files' tensors (views of the live ones), rank 0's first with the buffers;
// their names from index `first_shard` on (a pipeline stage's: after the stages before it).
void add_shard_files(SaveSnapshot& snapshot, const ShardedView& model, const OptimizerSet& optimizers,
                     const NamedTensors& buffers, const AgreementGroups& own, int first_shard) {
  snapshot.files = shard_files_contents(model, optimizers, own);
  snapshot.holds_buffers = own.rank() == 0 && !buffers.empty();
  if (snapshot.holds_buffers) {
    if (snapshot.files.empty()) snapshot.files.resize(1);
    add_buffers(snapshot.files[0], buffers);
    snapshot.buffers = describe_buffers(buffers);
  }
  snapshot.kinds = optimizers.kinds_in_use();
  snapshot.kinds.insert(snapshot.kinds.end(), {"param", "step"});
  // Under tensor parallelism each tp rank's shard group writes its own files.
  const int shard = first_shard + model.shard_rank() * own.tp_size() + own.tp_rank();
  const int parts = static_cast<int>(snapshot.files.size());
  for (int k = 0; k < parts; ++k) snapshot.files[k].name = shard_file_name(shard, k, parts);
}

// Writes shard file `k` of this rank's snapshot; returns its description for metadata.json.
FileMeta write_shard_file(SaveSnapshot& snapshot, size_t k) {
  ShardFileContents& contents = snapshot.files[k];
  FileMeta file;
  file.name = contents.name;
  const WrittenFile written = save_safetensors(
      snapshot.folder + "/" + file.name, contents.tensors,
      {{"DCP_SHARDING_INFO", contents.sharding_info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
  file.bytes = written.bytes;
  std::map<std::string, uint32_t> crc_of_key;
  for (size_t t = 0; t < contents.tensors.size(); ++t) {
    crc_of_key[contents.tensors[t].first] = written.tensor_crc32[t];
  }
  for (auto& piece : contents.pieces) {
    for (const auto& kind : snapshot.kinds) {
      auto it = crc_of_key.find(tensor_key(kind, piece.param));
      if (it != crc_of_key.end()) piece.crc32[kind] = it->second;
    }
  }
  for (auto& b : snapshot.buffers) {  // in some first file (one per stage when joined)
    auto it = crc_of_key.find(b.name);
    if (it == crc_of_key.end()) continue;
    b.file = file.name;
    b.crc32 = it->second;
  }
  file.pieces = std::move(contents.pieces);
  contents = ShardFileContents{};  // written: its tensors (a staging arena's) are free again
  return file;
}

}  // namespace

SaveSnapshot take_snapshot(const ShardedModel& sharded, const std::vector<torch::optim::Optimizer*>& optimizers_in,
                           const std::string& folder, const nlohmann::json& extra, const StageSave* stage) {
  const NamedTensors buffers = module_buffers(sharded.module());
  const ShardedView model(sharded);
  // The same on every rank (the same optimizers): every rank throws, before any collective.
  const OptimizerSet optimizers(optimizers_in, model, "save_sharded");
  SaveSnapshot snapshot;
  snapshot.folder = folder;
  const AgreementGroups own = agreement_groups(model);  // under tensor parallelism, every tp rank's too
  snapshot.of_stage = stage != nullptr;
  snapshot.world = snapshot.of_stage ? AgreementGroups{stage->world, nullptr} : own;
  snapshot.holds_meta = own.rank() == 0;
  const AgreementGroups& world = snapshot.world;
  warn_if_replicas_drifted(model, "save_sharded");  // only tp rank 0's replicated values are saved
  // Before anything is written: a tensor the optimizer holds outside the model is refused here.
  std::vector<ParamGroupMeta> param_groups;
  std::string error = try_local([&] {
    param_groups = describe_param_groups(model, optimizers, "save_sharded", stage ? stage->siblings : kNoSiblings);
  });
  throw_if_any_failed(world, error, "save_sharded: cannot save " + folder);
  // An old metadata.json would make a half-rewritten folder look complete.
  error = try_local([&] {
    if (world.rank() != 0) return;
    fs::create_directories(folder);
    fs::remove(folder + "/" + kMetadataFile);
  });
  throw_if_any_failed(world, error, "save_sharded: cannot prepare " + folder);
  // One shard file per shard of the first replica (the others hold the same values).
  snapshot.writer = model.first_replica();
  error = try_local([&] {
    if (snapshot.writer) add_shard_files(snapshot, model, optimizers, buffers, own, stage ? stage->first_shard : 0);
    if (snapshot.holds_meta) snapshot.meta = metadata_without_files(model, optimizers, world, param_groups, extra);
    // The tp size is the model's own, also when `world` spans pipeline stages (its tp is unset).
    if (snapshot.holds_meta) snapshot.meta.tp_size = own.tp_size();
  });
  throw_if_any_failed(world, error, "save_sharded: cannot save " + folder);
  return snapshot;
}

std::vector<ShardFileContents> local_shard_files(const ShardedModel& sharded,
                                                 const std::vector<torch::optim::Optimizer*>& optimizers_in) {
  const ShardedView model(sharded);
  if (!model.first_replica()) return {};
  const OptimizerSet optimizers(optimizers_in, model, "reserve_staging_arena");
  SaveSnapshot snapshot;
  add_shard_files(snapshot, model, optimizers, module_buffers(sharded.module()), agreement_groups(model), 0);
  return std::move(snapshot.files);
}

SaveSnapshot join_stage_snapshots(std::vector<SaveSnapshot> stages) {
  TORCH_CHECK(!stages.empty(), "join_stage_snapshots: no stage");
  SaveSnapshot joined = std::move(stages.front());
  std::vector<std::string> metas;  // merged here as rank 0 merges every rank's
  if (joined.holds_meta) metas.push_back(to_json(joined.meta).dump());
  for (size_t s = 1; s < stages.size(); ++s) {
    SaveSnapshot& stage = stages[s];
    joined.writer = joined.writer || stage.writer;
    for (auto& file : stage.files) joined.files.push_back(std::move(file));
    for (const auto& kind : stage.kinds) {
      if (std::find(joined.kinds.begin(), joined.kinds.end(), kind) == joined.kinds.end()) joined.kinds.push_back(kind);
    }
    joined.holds_buffers = joined.holds_buffers || stage.holds_buffers;
    joined.buffers.insert(joined.buffers.end(), stage.buffers.begin(), stage.buffers.end());
    if (stage.holds_meta) metas.push_back(to_json(stage.meta).dump());
  }
  joined.holds_meta = !metas.empty();
  if (joined.holds_meta) joined.meta = merge_stage_metadata(metas, joined.world.size());
  return joined;
}

void write_snapshot(SaveSnapshot& snapshot, size_t first, size_t last, const SaveHooks& hooks) {
  if (!snapshot.writer) return;
  nlohmann::json files = snapshot.description.empty() ? nlohmann::json::array()
                                                      : nlohmann::json::parse(snapshot.description);
  if (first == 0 && hooks.before_shard_files) hooks.before_shard_files();
  for (size_t k = first; k < last && k < snapshot.files.size(); ++k) {
    files.push_back(to_json(write_shard_file(snapshot, k)));
  }
  snapshot.description = files.dump();
  if (last >= snapshot.files.size() && hooks.after_shard_files) hooks.after_shard_files();
}

void complete_snapshot(SaveSnapshot& snapshot, const std::string& write_error) {
  const AgreementGroups& world = snapshot.world;
  throw_if_any_failed(world, write_error, "save_sharded: cannot write " + snapshot.folder);
  const auto descriptions = all_gather_strings(world, snapshot.writer ? snapshot.description : "");
  if (snapshot.holds_meta) snapshot.meta.buffers = snapshot.buffers;
  std::vector<std::string> stage_metas;
  if (snapshot.of_stage) stage_metas = all_gather_strings(world, snapshot.holds_meta ? to_json(snapshot.meta).dump() : "");
  const std::string error = try_local([&] {
    if (world.rank() != 0) return;
    if (snapshot.of_stage) snapshot.meta = merge_stage_metadata(stage_metas, world.size());
    CheckpointMeta& meta = snapshot.meta;
    for (const auto& description : descriptions) {
      if (description.empty()) continue;  // a replica that wrote nothing
      for (const auto& file : nlohmann::json::parse(description)) meta.files.push_back(parse_file_meta(file));
    }
    const std::string metadata = snapshot.folder + "/" + kMetadataFile;
    if (snapshot.of_stage) check_files_unique(meta, metadata);
    check_matches_model(meta, meta.params, metadata);  // a complete layout
    if (meta.buffers) check_buffers_match(meta, *meta.buffers, metadata);
    const std::string text = to_json(meta).dump(1);
    write_file_atomically(metadata, std::vector<char>(text.begin(), text.end()));
  });
  throw_if_any_failed(world, error, "save_sharded: cannot complete " + snapshot.folder);
}

}  // namespace fsdp::detail

namespace fsdp {

void save_sharded(const ShardedModel& sharded, torch::optim::Optimizer& optimizer, const std::string& folder,
                  const nlohmann::json& extra, const SaveHooks& hooks) {
  save_sharded(sharded, std::vector<torch::optim::Optimizer*>{&optimizer}, folder, extra, hooks);
}

void save_sharded(const ShardedModel& sharded, const std::vector<torch::optim::Optimizer*>& optimizers,
                  const std::string& folder, const nlohmann::json& extra, const SaveHooks& hooks) {
  detail::wait_for_pending_save();  // an asynchronous save still writing comes first
  detail::SaveSnapshot snapshot = detail::take_snapshot(sharded, optimizers, folder, extra);
  const std::string error = detail::try_local(
      [&] { detail::write_snapshot(snapshot, 0, snapshot.files.size(), hooks); });
  detail::complete_snapshot(snapshot, error);
}

}  // namespace fsdp
