// Saving a sharded checkpoint (include/fsdp/checkpoint.h): each writing rank's pieces of the
// parameters and of the AdamW state to its shard files, then metadata.json, written last by
// rank 0 ([Note: checkpoint agreement] between the phases).
#include <fsdp/checkpoint.h>
#include <fsdp/safetensors.h>

#include "io/adamw_state.h"
#include "io/checkpoint_agreement.h"
#include "io/checkpoint_pieces.h"
#include "io/tensor_boxes.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <map>

namespace fsdp::detail {

namespace {

namespace fs = std::filesystem;

// The tensors of one shard file: for each box, the parameter's and its AdamW moments' views.
struct ShardFileContents {
  NamedTensors tensors;
  nlohmann::json sharding_info = nlohmann::json::object();  // DCP_SHARDING_INFO
  std::vector<PieceMeta> pieces;
};

// torch.distributed.checkpoint's HuggingFaceStorageReader reads a box's place in the full tensor
// from the file's __metadata__: {"DCP_SHARDING_INFO": "{KEY: {\"saved_offsets\": [...]}}"}.
void add_box(ShardFileContents& contents, const std::string& key, const at::Tensor& data,
             const std::vector<int64_t>& offsets) {
  contents.tensors.emplace_back(key, data);
  contents.sharding_info[key] = {{"saved_offsets", offsets}};
}

// Splits this rank's pieces into boxes ([Note: boxes of a flat shard]); shard file k holds the
// k-th box of every piece. AdamW's step goes, as a 0-d float ("state.NAME.step", as PyTorch's
// AdamW keeps it), with the box that starts the parameter.
std::vector<ShardFileContents> shard_files_contents(FsdpState& state, torch::optim::AdamW& optimizer) {
  std::vector<ShardFileContents> files;
  for (const auto& piece : local_pieces(state)) {
    const FlatEntry& entry = *piece.entry;
    const auto* adam = adamw_state(optimizer, entry.param);
    const auto boxes = boxes_of_range(entry.shape, piece.begin, piece.end);
    if (files.size() < boxes.size()) files.resize(boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k) {
      const TensorBox& box = boxes[k];
      ShardFileContents& contents = files[k];
      auto view = [&](const at::Tensor& flat) {
        return flat.narrow(0, box.begin - piece.begin, box.end - box.begin).view(box.sizes);
      };
      add_box(contents, tensor_key("param", entry.name), view(piece.data), box.offsets);
      contents.pieces.push_back(PieceMeta{entry.name, box.begin, box.end, {}});
      if (!adam) continue;
      for (const char* kind : kMomentKinds) {
        const at::Tensor m = moment(*adam, kind);
        if (m.defined()) add_box(contents, tensor_key(kind, entry.name), view(m.reshape({-1})), box.offsets);
      }
      if (box.begin == 0) {
        add_box(contents, tensor_key("step", entry.name),
                at::scalar_tensor(static_cast<double>(adam->step()), at::kFloat), {});
      }
    }
  }
  return files;
}

// Writes this rank's shard files; returns their descriptions for metadata.json.
std::vector<FileMeta> write_shard_files(FsdpState& state, torch::optim::AdamW& optimizer,
                                        const std::string& folder) {
  auto contents_by_file = shard_files_contents(state, optimizer);
  std::vector<FileMeta> files;
  for (size_t k = 0; k < contents_by_file.size(); ++k) {
    ShardFileContents& contents = contents_by_file[k];
    FileMeta file;
    file.name = shard_file_name(state.collectives().rank(), static_cast<int>(k),
                                static_cast<int>(contents_by_file.size()));
    const WrittenFile written = save_safetensors(
        folder + "/" + file.name, contents.tensors,
        {{"DCP_SHARDING_INFO", contents.sharding_info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
    file.bytes = written.bytes;
    std::map<std::string, uint32_t> crc_of_key;
    for (size_t t = 0; t < contents.tensors.size(); ++t) {
      crc_of_key[contents.tensors[t].first] = written.tensor_crc32[t];
    }
    for (auto& piece : contents.pieces) {
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"}) {
        auto it = crc_of_key.find(tensor_key(kind, piece.param));
        if (it != crc_of_key.end()) piece.crc32[kind] = it->second;
      }
    }
    file.pieces = std::move(contents.pieces);
    files.push_back(std::move(file));
  }
  return files;
}

CheckpointMeta build_metadata(FsdpState& state, torch::optim::AdamW& optimizer,
                              const std::vector<std::string>& descriptions,
                              const nlohmann::json& extra) {
  CheckpointMeta meta;
  meta.world_size = state.world().size();
  meta.shard_group_size = state.collectives().size();
  meta.strategy = to_string(state.options().strategy());
  meta.params = describe_model(state, optimizer);
  for (const auto& description : descriptions) {
    if (description.empty()) continue;  // a replica that wrote nothing
    for (const auto& file : nlohmann::json::parse(description)) {
      meta.files.push_back(parse_file_meta(file));
    }
  }
  meta.extra = extra;
  return meta;
}

}  // namespace

void save_sharded(FsdpState& state, torch::optim::AdamW& optimizer, const std::string& folder,
                  const nlohmann::json& extra, const SaveHooks& hooks) {
  ProcessGroup& world = state.world();
  const std::string metadata = folder + "/" + kMetadataFile;
  // An old metadata.json would make a half-rewritten folder look complete.
  std::string error = try_local([&] {
    if (world.rank() != 0) return;
    fs::create_directories(folder);
    fs::remove(metadata);
  });
  throw_if_any_failed(world, error, "save_sharded: cannot prepare " + folder);

  // One shard file per shard of the first replica (the others hold the same values).
  auto* replicas = state.replicate_collectives();
  const bool writer = replicas == nullptr || replicas->rank() == 0;
  std::string description;
  error = try_local([&] {
    if (!writer) return;
    nlohmann::json files = nlohmann::json::array();
    for (const auto& file : write_shard_files(state, optimizer, folder)) files.push_back(to_json(file));
    description = files.dump();
    if (hooks.after_shard_files) hooks.after_shard_files();
  });
  throw_if_any_failed(world, error, "save_sharded: cannot write " + folder);

  const auto descriptions = all_gather_strings(world, description);
  error = try_local([&] {
    if (world.rank() != 0) return;
    const CheckpointMeta meta = build_metadata(state, optimizer, descriptions, extra);
    check_matches_model(meta, describe_model(state, optimizer), metadata);  // a complete layout
    const std::string text = to_json(meta).dump(1);
    write_file_atomically(metadata, std::vector<char>(text.begin(), text.end()));
  });
  throw_if_any_failed(world, error, "save_sharded: cannot complete " + folder);
}

}  // namespace fsdp::detail
