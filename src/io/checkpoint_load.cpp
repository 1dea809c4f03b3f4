// Loading a sharded checkpoint (include/fsdp/checkpoint.h), saved by any layout: every rank
// stages its pieces of the parameters and of the optimizer's state, and the model's buffers, in
// fresh tensors, and copies them into the model and the optimizer only once every rank has
// succeeded ([Note: checkpoint agreement]).
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>
#include <fsdp/parallelize.h>

#include "io/checkpoint_agreement.h"
#include "io/checkpoint_pieces.h"
#include "io/checkpoint_read.h"
#include "io/global_boxes.h"
#include "io/param_groups.h"
#include "io/stage_metadata.h"
#include "optim/optimizer_kinds.h"
#include "util/crc32.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

namespace fsdp::detail {

namespace {

/// What one local piece becomes, staged in fresh tensors until every rank has validated.
struct StagedPiece {
  ShardedParam piece;
  at::Tensor param;                       // 1-D [end - begin]
  std::optional<ParamOptimState> state;   // tensors 1-D [end - begin]; empty: the saved run had none
};

/// The model's buffers and the saved values they get.
using StagedBuffers = std::vector<std::pair<at::Tensor, at::Tensor>>;

// The boxes of the whole parameter that this rank's piece holds ([Note: boxes of a
// tensor-parallel part]): what it reads, whatever layout saved them.
std::vector<PlacedBox> needed_boxes(const ShardedParam& piece) {
  return boxes_in_whole(piece.shape(), piece.begin(), piece.end(), part_in_whole(piece));
}

// Opens the shard files holding elements of this rank's pieces.
OpenFiles open_needed_files(const std::vector<ShardedParam>& pieces, const CheckpointMeta& meta,
                            const PieceIndex& index, const std::string& folder,
                            const std::map<std::string, const ParamMeta*>& params) {
  OpenFiles files;
  for (const auto& piece : pieces) {
    const ParamMeta& param = *params.at(piece.name());
    for (const PlacedBox& box : needed_boxes(piece)) {
      for (const auto& [f, saved] : index.at(piece.name())) {
        if (!files.count(f) && overlaps(*saved, param, box)) {
          files.emplace(f, open_shard_file(folder, meta.files[f], params));
        }
      }
    }
  }
  return files;
}

bool lists_kind(const ParamMeta& saved, const std::string& kind) {
  return std::find(saved.moments.begin(), saved.moments.end(), kind) != saved.moments.end();
}

// The optimizer needs its state tensor `kind` of `saved`: metadata.json must list it. Other
// options of the saved optimizer (no amsgrad, no momentum) leave `kind` out of every parameter;
// one parameter without it while another has it is an incomplete or edited checkpoint.
void check_moment_saved(const CheckpointMeta& meta, const ParamMeta& saved,
                        const std::string& kind, const std::string& folder) {
  if (lists_kind(saved, kind)) return;
  const std::string& optimizer = saved.optimizer;
  // Among the parameters of the same optimizer class (Muon's never list AdamW's kinds).
  const bool options_differ = std::none_of(meta.params.begin(), meta.params.end(), [&](const ParamMeta& p) {
    return p.optimizer == optimizer && lists_kind(p, kind);
  });
  const optimizers::AddedBy added_by = optimizers::option_adding(kind);
  TORCH_CHECK(!options_differ || added_by != optimizers::AddedBy::Amsgrad, folder, " has no '", kind, "' for '",
              saved.name, "': it was saved by an ", optimizer, " without amsgrad");
  TORCH_CHECK(!options_differ || added_by == optimizers::AddedBy::Always, folder,
              " has no '", kind, "' for '", saved.name, "': it was saved by an ", optimizer,
              " with other options (momentum, centered): build the optimizer as the saved run did");
  TORCH_CHECK(false, folder, "/", kMetadataFile, ": parameter '", saved.name, "' has ", optimizer,
              " state without its '", kind, "' (", tensor_key(kind, saved.name), " is not among "
              "its optimizer_moments): the checkpoint is incomplete or was edited; resume from an "
              "intact copy of the checkpoint (or an earlier one)");
}

// A state tensor that holds inf or NaN would freeze its parameter (or make it NaN) for good.
void check_moment_finite(const at::Tensor& moment, const std::string& optimizer,
                         const std::string& kind, const std::string& name, const std::string& folder) {
  TORCH_CHECK(at::isfinite(moment).all().item<bool>(), folder, ": ", optimizer, "'s ", tensor_key(kind, name),
              " holds inf or NaN: the checkpoint was saved from a diverged run or edited; resume "
              "from an earlier checkpoint");
}

// "Muon, AdamW".
std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// A saved parameter's state must be of the optimizer that holds the parameter now: another
// class's kinds differ ([Note: several optimizers, one checkpoint]).
void check_same_optimizers(const CheckpointMeta& meta, const ShardedView& model, const OptimizerSet& optimizers,
                           const std::string& folder) {
  const bool any_state = std::any_of(meta.params.begin(), meta.params.end(),
                                     [](const ParamMeta& p) { return p.has_state(); });
  // The fix names a way that works: a load that throws leaves nothing to clear afterwards.
  if (meta.optimizers.size() == 1 && optimizers.size() == 1) {
    const std::string mine = optimizers.name();
    TORCH_CHECK(!any_state || meta.optimizer == mine, folder, "/", kMetadataFile,
                " holds ", meta.optimizer, " state but the program's optimizer is ", mine,
                ": build an ", meta.optimizer, " as the saved run did to resume it (to switch "
                "optimizers, load with that ", meta.optimizer, ", then build the ", mine,
                " over model->parameters(): it starts afresh)");
    return;
  }
  std::map<std::string, const ParamMeta*> saved;
  for (const auto& p : meta.params) saved[p.name] = &p;
  for (const auto& p : model.params()) {
    const ParamMeta& s = *saved.at(p.name());
    const auto k = optimizers.holder(p.param());
    if (!s.has_state() || !k) continue;  // no holder: stage_optimizer_state names it
    const std::string& mine = optimizers.state(*k).name();
    TORCH_CHECK(s.optimizer == mine, folder, "/", kMetadataFile, ": parameter '", p.name(),
                "' holds ", s.optimizer, " state (the checkpoint is of ", listed(meta.optimizers),
                ") but the program's optimizer ", *k, ", which holds it now, is ", a_class(mine), ": ",
                s.optimizer, "'s state does not resume ", a_class(mine), ". To resume, build the "
                "optimizers as the saved run did (this parameter in its ", s.optimizer, "); to change "
                "its optimizer, reset the optimizer state: load with the saved run's optimizers, then "
                "build the new ones over the parameters (they start afresh)");
  }
  // Every state in the right class, yet the param groups in another order would lose the options.
  TORCH_CHECK(!any_state || !meta.param_groups || meta.optimizers == optimizers.names(), folder, "/",
              kMetadataFile, " was saved by the optimizers ", listed(meta.optimizers),
              " but the program passes ", listed(optimizers.names()), ": pass the optimizers of "
              "the saved run, in its order, to resume its state and param groups");
}

std::optional<ParamOptimState> stage_optimizer_state(const ShardedParam& piece, const ParamMeta& saved,
                                                     const CheckpointMeta& meta,
                                                     const OptimizerSet& optimizers,
                                                     const StagedOptions& options,
                                                     const PieceIndex& index, const OpenFiles& files,
                                                     const std::string& folder) {
  if (!saved.has_state()) return std::nullopt;
  const std::string& name = piece.name();
  // The kinds of the options it resumes with: the saved ones (amsgrad, momentum...) when staged.
  const auto kinds = optimizers.kinds_needed(piece.param(), options);
  TORCH_CHECK(kinds, folder, " holds ", saved.optimizer, " state for '", name, "' but ",
              optimizers.size() == 1 ? "the optimizer does not hold that parameter: build it over "
                                       "model->parameters()"
                                     : "none of the optimizers holds that parameter: build them over "
                                       "model->parameters(), each parameter in one");
  const bool counts_steps = optimizers.state(*optimizers.holder(piece.param())).counts_steps();
  ParamOptimState staged{counts_steps ? saved.step : std::nullopt, {}};
  TORCH_CHECK(!counts_steps || saved.step, folder, "/", kMetadataFile, ": parameter '",
              name, "' has ", saved.optimizer, " state without its step (optimizer_step): the "
              "file was edited; resume from an intact checkpoint");
  for (const auto& kind : *kinds) {
    check_moment_saved(meta, saved, kind, folder);
    at::Tensor t = at::empty({piece.end() - piece.begin()}, piece.data().options());
    assemble(t, piece.begin(), needed_boxes(piece), kind, saved, index, files);
    check_moment_finite(t, saved.optimizer, kind, name, folder);
    staged.tensors.emplace(kind, t);
  }
  return staged;
}

std::vector<StagedPiece> stage(const ShardedView& model, const OptimizerSet& optimizers,
                               const StagedOptions& options, const CheckpointMeta& meta,
                               const std::string& folder) {
  std::map<std::string, const ParamMeta*> params;
  for (const auto& p : meta.params) params[p.name] = &p;
  const PieceIndex index = index_pieces(meta);
  const std::vector<ShardedParam> pieces = local_pieces(model);
  const OpenFiles files = open_needed_files(pieces, meta, index, folder, params);

  std::vector<StagedPiece> staged;
  for (const auto& piece : pieces) {
    const std::string& name = piece.name();
    const ParamMeta& saved = *params.at(name);
    StagedPiece s{piece, at::empty({piece.end() - piece.begin()}, piece.data().options()), {}};
    assemble(s.param, piece.begin(), needed_boxes(piece), "param", saved, index, files);
    s.state = stage_optimizer_state(piece, saved, meta, optimizers, options, index, files, folder);
    staged.push_back(std::move(s));
  }
  return staged;
}

// Each buffer whole from its file, checked against its CRC-32; none when the checkpoint
// predates saved buffers (the model keeps its own).
StagedBuffers stage_buffers(const NamedTensors& buffers, const CheckpointMeta& meta,
                            const std::string& folder) {
  StagedBuffers staged;
  if (!meta.buffers) return staged;
  std::map<std::string, const BufferMeta*> saved;
  for (const auto& b : *meta.buffers) saved[b.name] = &b;
  std::map<std::string, const ParamMeta*> params;
  for (const auto& p : meta.params) params[p.name] = &p;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files;
  for (const auto& [name, buffer] : buffers) {
    const BufferMeta& b = *saved.at(name);
    const FileMeta& file = *std::find_if(meta.files.begin(), meta.files.end(),
                                         [&](const FileMeta& f) { return f.name == b.file; });
    auto& reader = files[b.file];
    if (!reader) reader = open_shard_file(folder, file, params);
    at::Tensor value = read_whole_checked(*reader, b);
    staged.emplace_back(buffer, std::move(value));
  }
  return staged;
}

// The saved options of each param group, when the checkpoint holds them for these optimizers'
// classes (a checkpoint of other classes without state loads its parameters only).
StagedOptions stage_options(const CheckpointMeta& meta, const ShardedView& model, const OptimizerSet& optimizers,
                            const std::string& metadata, const std::set<const void*>& siblings) {
  if (!meta.param_groups || meta.optimizers != optimizers.names()) return {};
  return stage_param_group_options(*meta.param_groups, model, optimizers, metadata, siblings);
}

// Copies the staged pieces into the shards, the buffers into the model, and replaces the
// optimizer's state and options. Cannot fail.
void apply(OptimizerSet& optimizers, StagedOptions& options, std::vector<StagedPiece>& staged,
           StagedBuffers& buffers) {
  torch::NoGradGuard no_grad;
  apply_param_group_options(optimizers, options);
  for (auto& s : staged) {
    s.piece.data().copy_(s.param);
    const at::Tensor& param = s.piece.param();
    if (s.state) {
      for (auto& item : s.state->tensors) item.second = item.second.view(param.sizes());
    }
    optimizers.write(param, s.state);
  }
  for (auto& [buffer, value] : buffers) buffer.copy_(value);
}

// What a stage reads of a checkpoint of the whole model, once every parameter is claimed by a
// stage ([Note: one folder, many stages]).
CheckpointMeta stage_view(const CheckpointMeta& meta, const ShardedView& model, const NamedTensors& buffers,
                          const StageLoad& stage, const std::string& metadata) {
  check_all_claimed(meta, stage.claimed, metadata);
  std::set<std::string> params, buffer_names;
  for (const auto& p : model.params()) params.insert(p.name());
  for (const auto& b : buffers) buffer_names.insert(b.first);
  return restrict_to_model(meta, params, buffer_names);
}

// One model's load, staged and agreed on, not yet applied.
struct PreparedLoad {
  OptimizerSet optimizers;
  StagedOptions options;
  std::vector<StagedPiece> pieces;
  StagedBuffers buffers;
  nlohmann::json extra;
};

// Every check and read of `sharded`'s load, staged in fresh tensors; a collective: every rank
// throws if any rank failed or read another metadata.json. `scope`: one stage of several,
// `siblings` the parameters of this rank's other stages.
std::unique_ptr<PreparedLoad> prepare_load(const ShardedModel& sharded,
                                           const std::vector<torch::optim::Optimizer*>& optimizers_in,
                                           const std::string& folder, const StageLoad* scope,
                                           const std::set<const void*>& siblings) {
  const NamedTensors buffers = module_buffers(sharded.module());
  const ShardedView model(sharded);
  // The same on every rank (the same optimizers): every rank throws, before any collective.
  auto load = std::make_unique<PreparedLoad>(
      PreparedLoad{OptimizerSet(optimizers_in, model, "load_sharded"), {}, {}, {}, {}});
  OptimizerSet& optimizers = load->optimizers;
  // With the tp ranks, if any; a stage's agreements span every stage's ranks.
  const AgreementGroups world = scope ? AgreementGroups{scope->world, nullptr} : agreement_groups(model);
  const std::string metadata = folder + "/" + kMetadataFile;
  uint32_t metadata_crc = 0;
  std::string error = try_local([&] {
    TORCH_CHECK(std::filesystem::exists(metadata), metadata, " does not exist: ", folder,
                " is not a complete checkpoint (a save interrupted before it finished?)");
    const std::vector<char> text =
        read_regular_file(metadata, kMaxMetadataBytes, "a checkpoint's metadata.json");
    metadata_crc = crc32(text.data(), text.size());
    CheckpointMeta meta = parse_metadata(std::string(text.begin(), text.end()), metadata);
    for (const auto& file : meta.files) check_name_inside(folder, file.name, metadata);
    if (scope) meta = stage_view(meta, model, buffers, *scope, metadata);
    check_matches_model(meta, describe_model(model, optimizers), metadata);
    check_buffers_match(meta, describe_buffers(buffers), metadata);
    check_same_optimizers(meta, model, optimizers, folder);
    load->options = stage_options(meta, model, optimizers, metadata, siblings);
    load->pieces = stage(model, optimizers, load->options, meta, folder);
    load->buffers = stage_buffers(buffers, meta, folder);
    load->extra = meta.extra;
  });
  throw_if_any_failed(world, error, "load_sharded: cannot load " + folder);

  // Ranks that read different folders (no shared file system?) must not mix checkpoints. Over
  // the world process group itself, like the agreements (then the tp group: rank 0's to all).
  at::Tensor crc = at::full({1}, static_cast<int64_t>(metadata_crc), at::kLong);
  broadcast(*world.world, crc, /*root=*/0);
  if (world.tp) broadcast(world.tp->group(), crc, /*root=*/0);
  error = crc.item<int64_t>() == static_cast<int64_t>(metadata_crc)
              ? ""
              : metadata + " differs from rank 0's: every rank must read the same checkpoint";
  throw_if_any_failed(world, error, "load_sharded: cannot load " + folder);
  return load;
}

// The parameters (TensorImpls) of `models` but model `but`.
std::set<const void*> params_of_others(const std::vector<ShardedModel>& models, size_t but) {
  std::set<const void*> params;
  for (size_t m = 0; m < models.size(); ++m) {
    if (m == but) continue;
    for (const auto& p : ShardedView(models[m]).params()) params.insert(p.param().unsafeGetTensorImpl());
  }
  return params;
}

}  // namespace

}  // namespace fsdp::detail

namespace fsdp {

nlohmann::json load_sharded(const ShardedModel& sharded, torch::optim::Optimizer& optimizer,
                            const std::string& folder) {
  return load_sharded(sharded, std::vector<torch::optim::Optimizer*>{&optimizer}, folder);
}

nlohmann::json load_sharded(const ShardedModel& sharded, const std::vector<torch::optim::Optimizer*>& optimizers_in,
                            const std::string& folder) {
  return detail::load_model(sharded, optimizers_in, folder);
}

}  // namespace fsdp

namespace fsdp::detail {

nlohmann::json load_model(const ShardedModel& sharded, const std::vector<torch::optim::Optimizer*>& optimizers,
                          const std::string& folder) {
  const auto load = prepare_load(sharded, optimizers, folder, nullptr, {});
  apply(load->optimizers, load->options, load->pieces, load->buffers);
  return load->extra;
}

nlohmann::json load_stages(const std::vector<ShardedModel>& stages,
                           const std::vector<torch::optim::Optimizer*>& optimizers, const std::string& folder,
                           const StageLoad& scope) {
  // Every stage staged and agreed on before any is changed: a failed load leaves them all as they were.
  std::vector<std::unique_ptr<PreparedLoad>> loads;
  for (size_t s = 0; s < stages.size(); ++s) {
    loads.push_back(prepare_load(stages[s], optimizers, folder, &scope, params_of_others(stages, s)));
  }
  for (auto& load : loads) apply(load->optimizers, load->options, load->pieces, load->buffers);
  return loads.empty() ? nlohmann::json::object() : loads.front()->extra;
}

}  // namespace fsdp::detail
