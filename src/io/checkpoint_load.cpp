// Loading a sharded checkpoint (include/fsdp/checkpoint.h), saved by any layout: every rank
// stages its pieces of the parameters and of the AdamW state in fresh tensors, and copies them
// into the model and the optimizer only once every rank has succeeded ([Note: checkpoint
// agreement]).
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>

#include "io/adamw_state.h"
#include "io/checkpoint_agreement.h"
#include "io/checkpoint_pieces.h"
#include "io/checkpoint_read.h"
#include "util/crc32.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <optional>

namespace fsdp::detail {

namespace {

using torch::optim::AdamW;
using torch::optim::AdamWParamState;

/// What one local piece becomes, staged in fresh tensors until every rank has validated.
struct StagedPiece {
  LocalPiece piece;
  at::Tensor param;                           // 1-D [end - begin]
  std::optional<int64_t> step;                // AdamW step; empty: the saved run had no state
  std::map<std::string, at::Tensor> moments;  // kind -> 1-D [end - begin]
};

// Opens the shard files holding elements of this rank's pieces.
OpenFiles open_needed_files(const std::vector<LocalPiece>& pieces, const CheckpointMeta& meta,
                            const PieceIndex& index, const std::string& folder,
                            const std::map<std::string, const ParamMeta*>& params) {
  OpenFiles files;
  for (const auto& piece : pieces) {
    if (piece.begin == piece.end) continue;
    for (const auto& [f, saved] : index.at(piece.entry->name)) {
      if (saved->begin < piece.end && piece.begin < saved->end && !files.count(f)) {
        files.emplace(f, open_shard_file(folder, meta.files[f], params));
      }
    }
  }
  return files;
}

// The optimizer needs AdamW's moment `kind` of `saved`: metadata.json must list it.
void check_moment_saved(const ParamMeta& saved, const std::string& kind, const std::string& folder) {
  if (std::find(saved.moments.begin(), saved.moments.end(), kind) != saved.moments.end()) return;
  TORCH_CHECK(kind != "max_exp_avg_sq", folder, " has no '", kind, "' for '", saved.name,
              "': it was saved by an AdamW without amsgrad");
  TORCH_CHECK(false, folder, "/", kMetadataFile, ": parameter '", saved.name, "' has AdamW "
              "state without its '", kind, "' (", tensor_key(kind, saved.name), " is not among "
              "its optimizer_moments): the checkpoint is incomplete or was edited; resume from an "
              "intact checkpoint");
}

// A moment that holds inf or NaN would freeze its parameter (or make it NaN) for good.
void check_moment_finite(const at::Tensor& moment, const std::string& kind, const std::string& name,
                         const std::string& folder) {
  TORCH_CHECK(at::isfinite(moment).all().item<bool>(), folder, ": AdamW's ", tensor_key(kind, name),
              " holds inf or NaN: the checkpoint was saved from a diverged run or edited; resume "
              "from an earlier checkpoint");
}

std::vector<StagedPiece> stage(FsdpState& state, AdamW& optimizer, const CheckpointMeta& meta,
                               const std::string& folder) {
  std::map<std::string, const ParamMeta*> params;
  for (const auto& p : meta.params) params[p.name] = &p;
  const PieceIndex index = index_pieces(meta);
  const auto options = options_by_param(optimizer);
  const std::vector<LocalPiece> pieces = local_pieces(state);
  const OpenFiles files = open_needed_files(pieces, meta, index, folder, params);

  std::vector<StagedPiece> staged;
  for (const auto& piece : pieces) {
    const std::string& name = piece.entry->name;
    const ParamMeta& saved = *params.at(name);
    StagedPiece s{piece, at::empty({piece.end - piece.begin}, piece.data.options()), saved.step, {}};
    assemble(s.param, piece.begin, piece.end, "param", name, index, files);
    if (saved.step) {
      auto it = options.find(piece.entry->param.unsafeGetTensorImpl());
      TORCH_CHECK(it != options.end(), folder, " holds AdamW state for '", name,
                  "' but the optimizer does not hold that parameter: build it over "
                  "model->parameters()");
      for (const auto& kind : moments_needed(*it->second)) {
        check_moment_saved(saved, kind, folder);
        s.moments[kind] = at::empty({piece.end - piece.begin}, piece.data.options());
        assemble(s.moments[kind], piece.begin, piece.end, kind, name, index, files);
        check_moment_finite(s.moments[kind], kind, name, folder);
      }
    }
    staged.push_back(std::move(s));
  }
  return staged;
}

// Copies the staged pieces into the shards and replaces the optimizer's state. Cannot fail.
void apply(AdamW& optimizer, std::vector<StagedPiece>& staged) {
  torch::NoGradGuard no_grad;
  for (auto& s : staged) {
    s.piece.data.copy_(s.param);
    const at::Tensor& param = s.piece.entry->param;
    void* key = param.unsafeGetTensorImpl();
    if (!s.step) {
      optimizer.state().erase(key);
      continue;
    }
    auto adam = std::make_unique<AdamWParamState>();
    adam->step(*s.step);
    adam->exp_avg(s.moments.at("exp_avg").view(param.sizes()));
    adam->exp_avg_sq(s.moments.at("exp_avg_sq").view(param.sizes()));
    if (s.moments.count("max_exp_avg_sq")) {
      adam->max_exp_avg_sq(s.moments.at("max_exp_avg_sq").view(param.sizes()));
    }
    optimizer.state()[key] = std::move(adam);
  }
}

}  // namespace

nlohmann::json load_sharded(FsdpState& state, AdamW& optimizer, const std::string& folder) {
  ProcessGroup& world = state.world();
  const std::string metadata = folder + "/" + kMetadataFile;
  CheckpointMeta meta;
  std::vector<StagedPiece> staged;
  uint32_t metadata_crc = 0;
  std::string error = try_local([&] {
    TORCH_CHECK(std::filesystem::exists(metadata), metadata, " does not exist: ", folder,
                " is not a complete checkpoint (a save interrupted before it finished?)");
    const std::vector<char> text =
        read_regular_file(metadata, kMaxMetadataBytes, "a checkpoint's metadata.json");
    metadata_crc = crc32(text.data(), text.size());
    meta = parse_metadata(std::string(text.begin(), text.end()), metadata);
    for (const auto& file : meta.files) check_name_inside(folder, file.name, metadata);
    check_matches_model(meta, describe_model(state, optimizer), metadata);
    staged = stage(state, optimizer, meta, folder);
  });
  throw_if_any_failed(world, error, "load_sharded: cannot load " + folder);

  // Ranks that read different folders (no shared file system?) must not mix checkpoints. Over
  // the world process group itself, like the agreements.
  at::Tensor crc = at::full({1}, static_cast<int64_t>(metadata_crc), at::kLong);
  broadcast(world, crc, /*root=*/0);
  error = crc.item<int64_t>() == static_cast<int64_t>(metadata_crc)
              ? ""
              : metadata + " differs from rank 0's: every rank must read the same checkpoint";
  throw_if_any_failed(world, error, "load_sharded: cannot load " + folder);

  apply(optimizer, staged);
  return meta.extra;
}

}  // namespace fsdp::detail
