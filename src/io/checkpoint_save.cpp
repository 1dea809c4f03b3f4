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
struct ShardPart {
  NamedTensors tensors;
  nlohmann::json sharding_info = nlohmann::json::object();  // DCP_SHARDING_INFO
  std::vector<PieceMeta> pieces;
};

// torch.distributed.checkpoint's HuggingFaceStorageReader reads a chunk's place in the full tensor
// from the file's __metadata__: {"DCP_SHARDING_INFO": "{KEY: {\"saved_offsets\": [...]}}"}.
void add_box(ShardPart& part, const std::string& key, const at::Tensor& data,
             const std::vector<int64_t>& offsets) {
  part.tensors.emplace_back(key, data);
  part.sharding_info[key] = {{"saved_offsets", offsets}};
}

// Splits this rank's pieces into boxes ([Note: boxes of a flat shard]); part k of the files holds
// the k-th box of every piece. AdamW's step goes, as a 0-d float ("state.NAME.step", as PyTorch's
// AdamW keeps it), with the box that starts the parameter.
std::vector<ShardPart> shard_parts(FsdpState& state, torch::optim::AdamW& optimizer) {
  std::vector<ShardPart> parts;
  for (const auto& piece : local_pieces(state)) {
    const FlatEntry& entry = *piece.entry;
    const auto* adam = adamw_state(optimizer, entry.param);
    const auto boxes = boxes_of_range(entry.shape, piece.begin, piece.end);
    if (parts.size() < boxes.size()) parts.resize(boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k) {
      const TensorBox& box = boxes[k];
      ShardPart& part = parts[k];
      auto view = [&](const at::Tensor& flat) {
        return flat.narrow(0, box.begin - piece.begin, box.end - box.begin).view(box.sizes);
      };
      add_box(part, tensor_key("param", entry.name), view(piece.data), box.offsets);
      part.pieces.push_back(PieceMeta{entry.name, box.begin, box.end, {}});
      if (!adam) continue;
      for (const char* kind : kMomentKinds) {
        const at::Tensor m = moment(*adam, kind);
        if (m.defined()) add_box(part, tensor_key(kind, entry.name), view(m.reshape({-1})), box.offsets);
      }
      if (box.begin == 0) {
        add_box(part, tensor_key("step", entry.name),
                at::scalar_tensor(static_cast<double>(adam->step()), at::kFloat), {});
      }
    }
  }
  return parts;
}

// Writes this rank's shard files; returns their descriptions for metadata.json.
std::vector<FileMeta> write_shard_files(FsdpState& state, torch::optim::AdamW& optimizer,
                                        const std::string& folder) {
  auto parts = shard_parts(state, optimizer);
  std::vector<FileMeta> files;
  for (size_t k = 0; k < parts.size(); ++k) {
    ShardPart& part = parts[k];
    FileMeta file;
    file.name = shard_file_name(state.collectives().rank(), static_cast<int>(k),
                                static_cast<int>(parts.size()));
    const WrittenFile written = save_safetensors(
        folder + "/" + file.name, part.tensors,
        {{"DCP_SHARDING_INFO", part.sharding_info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
    file.bytes = written.bytes;
    std::map<std::string, uint32_t> crc_of_key;
    for (size_t t = 0; t < part.tensors.size(); ++t) {
      crc_of_key[part.tensors[t].first] = written.tensor_crc32[t];
    }
    for (auto& piece : part.pieces) {
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"}) {
        auto it = crc_of_key.find(tensor_key(kind, piece.param));
        if (it != crc_of_key.end()) piece.crc32[kind] = it->second;
      }
    }
    file.pieces = std::move(part.pieces);
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
