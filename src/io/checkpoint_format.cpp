#include "io/checkpoint_format.h"

#include <fsdp/bounded_json.h>

#include "io/tensor_boxes.h"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstdio>
#include <map>

namespace fsdp {

namespace {

// The fix of a checkpoint that describes another model (names, shapes, dtypes, buffers).
constexpr const char* kOtherModel = ": it was saved from another model; build the model as the saved run did";

constexpr const char* kFormat = "fsdp-cpp sharded checkpoint";
constexpr int kVersion = 2;  // 1: torch.save shard files (fsdp-cpp 0.x); 2: safetensors

// `several`: saved by several optimizers, each parameter names its own.
nlohmann::json to_json(const ParamMeta& p, bool several) {
  nlohmann::json j = {{"name", p.name}, {"shape", p.shape}, {"dtype", p.dtype}};
  j["optimizer_step"] = p.step ? nlohmann::json(*p.step) : nlohmann::json(nullptr);
  j["optimizer_moments"] = p.moments;
  if (several) j["optimizer"] = p.optimizer.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.optimizer);
  return j;
}

// The class of the optimizer that held an entry: its own "optimizer" when several saved, the
// file's otherwise.
std::string optimizer_of(const nlohmann::json& j, const CheckpointMeta& meta) {
  if (meta.optimizers.size() == 1) return meta.optimizer;
  const auto& name = j.at("optimizer");
  return name.is_null() ? "" : name.get<std::string>();
}

ParamMeta param_from_json(const nlohmann::json& j, const CheckpointMeta& meta) {
  ParamMeta p;
  p.optimizer = optimizer_of(j, meta);
  p.name = j.at("name").get<std::string>();
  p.shape = j.at("shape").get<std::vector<int64_t>>();
  p.dtype = j.at("dtype").get<std::string>();
  if (!j.at("optimizer_step").is_null()) p.step = j.at("optimizer_step").get<int64_t>();
  p.moments = j.at("optimizer_moments").get<std::vector<std::string>>();
  return p;
}

nlohmann::json to_json(const BufferMeta& b) {
  return {{"name", b.name}, {"shape", b.shape}, {"dtype", b.dtype}, {"file", b.file}, {"crc32", b.crc32}};
}

BufferMeta buffer_from_json(const nlohmann::json& j) {
  return BufferMeta{j.at("name").get<std::string>(), j.at("shape").get<std::vector<int64_t>>(),
                    j.at("dtype").get<std::string>(), j.at("file").get<std::string>(),
                    j.at("crc32").get<uint32_t>()};
}

nlohmann::json to_json(const ParamGroupMeta& g, bool several) {
  nlohmann::json j = g.options;
  j["params"] = g.params;
  if (several) j["optimizer"] = g.optimizer;
  return j;
}

ParamGroupMeta param_group_from_json(const nlohmann::json& j, const CheckpointMeta& meta) {
  ParamGroupMeta g{j.at("params").get<std::vector<std::string>>(), j, optimizer_of(j, meta)};
  g.options.erase("params");
  g.options.erase("optimizer");
  return g;
}

// A box piece's box lies inside its parameter and holds elements.
void check_box_inside(const PieceMeta& piece, const ParamMeta& param, const FileMeta& file,
                      const std::string& source) {
  bool inside = piece.offsets.size() == param.shape.size() && piece.sizes.size() == param.shape.size();
  for (size_t d = 0; inside && d < param.shape.size(); ++d) {
    inside = piece.offsets[d] >= 0 && piece.sizes[d] > 0 && piece.offsets[d] + piece.sizes[d] <= param.shape[d];
  }
  TORCH_CHECK(inside, source, ": ", file.name, " holds a piece ", piece.where(), " of '", piece.param,
              "', which is not a box of its shape ", shape_text(param.shape),
              ": the file was edited or is corrupt");
}

struct PieceBox {
  std::vector<int64_t> offsets, sizes;
  const std::string* file;
};

bool overlap(const PieceBox& a, const PieceBox& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  }
  return true;
}

// A parameter saved in boxes (tensor parallelism): boxes that do not overlap and together hold
// as many elements as it has cover it exactly once. Sorted along the first dimension, a box is
// compared only with those that start before it ends there.
void check_box_coverage(const ParamMeta& param, std::vector<PieceBox>& boxes, const std::string& source) {
  int64_t covered = 0;
  for (const auto& b : boxes) covered += c10::multiply_integers(b.sizes);
  std::sort(boxes.begin(), boxes.end(), [](const PieceBox& a, const PieceBox& b) { return a.offsets < b.offsets; });
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size() && boxes[j].offsets[0] < boxes[i].offsets[0] + boxes[i].sizes[0]; ++j) {
      TORCH_CHECK(!overlap(boxes[i], boxes[j]), source, ": the pieces of '", param.name, "' overlap: the box at ",
                  shape_text(boxes[i].offsets), " of ", shape_text(boxes[i].sizes), " (", *boxes[i].file,
                  ") and the box at ", shape_text(boxes[j].offsets), " of ", shape_text(boxes[j].sizes), " (",
                  *boxes[j].file, "): a shard file is listed twice, or it is corrupt");
    }
  }
  TORCH_CHECK(covered == param.numel(), source, ": the pieces of '", param.name, "' hold ", covered,
              " of its ", param.numel(), " elements: a shard file is missing from the metadata, or it is corrupt");
}

// Every element [0, numel) of every parameter in exactly one piece.
void check_coverage(const CheckpointMeta& meta, const std::string& source) {
  std::map<std::string, const ParamMeta*> params;
  for (const auto& p : meta.params) params[p.name] = &p;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;
  std::map<std::string, std::vector<PieceBox>> boxes;  // of the parameters saved in boxes
  for (const auto& file : meta.files) {
    for (const auto& piece : file.pieces) {
      if (piece.is_box()) {
        check_box_inside(piece, *params.at(piece.param), file, source);
        boxes[piece.param].push_back(PieceBox{piece.offsets, piece.sizes, &file.name});
        continue;
      }
      TORCH_CHECK(piece.begin >= 0 && piece.begin < piece.end, source, ": ", file.name,
                  " holds an empty or inverted piece [", piece.begin, ", ", piece.end, ") of '",
                  piece.param, "'");
      ranges[piece.param].emplace_back(piece.begin, piece.end);
    }
  }
  for (const auto& param : meta.params) {
    auto& list = ranges[param.name];
    if (boxes.count(param.name)) {  // its ranges as boxes too
      for (const auto& [begin, end] : list) {
        TORCH_CHECK(end <= param.numel(), source, ": a piece [", begin, ", ", end, ") of '", param.name,
                    "' lies past its ", param.numel(), " elements");
        for (const auto& b : boxes_of_range(param.shape, begin, end)) {
          boxes[param.name].push_back(PieceBox{b.offsets, b.sizes, &param.name});
        }
      }
      check_box_coverage(param, boxes[param.name], source);
      continue;
    }
    std::sort(list.begin(), list.end());
    int64_t covered = 0;
    for (const auto& [begin, end] : list) {
      TORCH_CHECK(begin == covered, source, ": the pieces of '", param.name, "' ",
                  begin > covered ? "leave out" : "overlap at", " elements [",
                  std::min(begin, covered), ", ", std::max(begin, covered),
                  "): a shard file is missing from the metadata, or it is corrupt");
      covered = end;
    }
    TORCH_CHECK(covered == param.numel(), source, ": the pieces of '", param.name, "' cover [0, ",
                covered, ") of its ", param.numel(), " elements");
  }
}

// An optimizer counts the steps it took: a negative count is an edit, and would be trained on.
void check_optimizer_steps(const CheckpointMeta& meta, const std::string& source) {
  for (const auto& param : meta.params) {
    TORCH_CHECK(!param.step || *param.step >= 0, source, ": parameter '", param.name,
                "' has ", param.optimizer, " step ", *param.step, " (optimizer_step), but a step count is never "
                "negative: the file was edited; resume from an intact checkpoint");
  }
}

// A parameter that metadata.json lists without optimizer state (no optimizer_moments, no
// optimizer_step) must have no state in its pieces either: SGD's one state tensor left out of
// optimizer_moments would otherwise make its parameter look stateless, and its momentum restart
// from zero without a word (a parameter the optimizer never stepped has no state saved at all).
void check_stateless_pieces(const CheckpointMeta& meta, const std::string& source) {
  std::map<std::string, const ParamMeta*> params;
  for (const auto& p : meta.params) params[p.name] = &p;
  for (const auto& file : meta.files) {
    for (const auto& piece : file.pieces) {
      const ParamMeta& param = *params.at(piece.param);
      if (param.has_state()) continue;
      for (const auto& [kind, crc] : piece.crc32) {
        TORCH_CHECK(kind == "param", source, ": parameter '", param.name, "' lists no ",
                    param.optimizer.empty() ? meta.optimizer : param.optimizer,
                    " state (no optimizer_moments, no optimizer_step) but ",
                    file.name, " holds its '", kind, "' (piece ", piece.where(),
                    "): the file was edited; resume from an intact copy of the checkpoint (or an "
                    "earlier one)");
      }
    }
  }
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t ParamMeta::numel() const { return c10::multiply_integers(shape); }

int64_t PieceMeta::numel() const { return is_box() ? c10::multiply_integers(sizes) : end - begin; }

std::string PieceMeta::where() const {
  if (!is_box()) return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  return "box " + shape_text(offsets) + " of " + shape_text(sizes);
}

bool piece_box(const PieceMeta& piece, const std::vector<int64_t>& shape, std::vector<int64_t>& offsets,
               std::vector<int64_t>& sizes) {
  if (piece.is_box()) {
    offsets = piece.offsets;
    sizes = piece.sizes;
    return true;
  }
  const std::vector<TensorBox> boxes = boxes_of_range(shape, piece.begin, piece.end);
  if (boxes.size() != 1) return false;
  offsets = boxes[0].offsets;
  sizes = boxes[0].sizes;
  return true;
}

std::string shard_file_name(int shard, int part, int parts) {
  char name[80];
  std::snprintf(name, sizeof name, "shard-%05d-model-%05d-of-%05d.safetensors", shard, part + 1,
                parts);
  return name;
}

std::string tensor_key(const std::string& kind, const std::string& param) {
  return kind == "param" ? param : "state." + param + "." + kind;
}

nlohmann::json to_json(const FileMeta& f) {
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& piece : f.pieces) {
    if (piece.is_box()) {
      pieces.push_back({{"param", piece.param}, {"offsets", piece.offsets}, {"sizes", piece.sizes},
                        {"crc32", piece.crc32}});
      continue;
    }
    pieces.push_back({{"param", piece.param}, {"begin", piece.begin}, {"end", piece.end},
                      {"crc32", piece.crc32}});
  }
  return {{"name", f.name}, {"bytes", f.bytes}, {"pieces", pieces}};
}

FileMeta parse_file_meta(const nlohmann::json& j) {
  FileMeta f;
  f.name = j.at("name").get<std::string>();
  f.bytes = j.at("bytes").get<int64_t>();
  for (const auto& piece : j.at("pieces")) {
    PieceMeta p{piece.at("param").get<std::string>(), 0, 0,
                piece.at("crc32").get<std::map<std::string, uint32_t>>(), {}, {}};
    if (piece.contains("offsets")) {  // a box piece: [Note: boxes of a tensor-parallel part]
      p.offsets = piece.at("offsets").get<std::vector<int64_t>>();
      p.sizes = piece.at("sizes").get<std::vector<int64_t>>();
    } else {
      p.begin = piece.at("begin").get<int64_t>();
      p.end = piece.at("end").get<int64_t>();
    }
    f.pieces.push_back(std::move(p));
  }
  return f;
}

nlohmann::json to_json(const CheckpointMeta& meta) {
  nlohmann::json params = nlohmann::json::array(), files = nlohmann::json::array();
  const bool several = meta.optimizers.size() > 1;
  for (const auto& p : meta.params) params.push_back(to_json(p, several));
  for (const auto& f : meta.files) files.push_back(to_json(f));
  nlohmann::json j = {{"format", kFormat},         {"version", kVersion},
                      {"world_size", meta.world_size}, {"shard_group_size", meta.shard_group_size},
                      {"strategy", meta.strategy}, {"optimizer", meta.optimizer},
                      {"params", params},          {"files", files},
                      {"extra", meta.extra}};
  if (meta.tp_size != 1) j["tp_size"] = meta.tp_size;
  if (meta.buffers) {
    j["buffers"] = nlohmann::json::array();
    for (const auto& b : *meta.buffers) j["buffers"].push_back(to_json(b));
  }
  if (meta.param_groups) {
    j["param_groups"] = nlohmann::json::array();
    for (const auto& g : *meta.param_groups) j["param_groups"].push_back(to_json(g, several));
  }
  if (several) j["optimizers"] = meta.optimizers;
  return j;
}

CheckpointMeta parse_metadata(const std::string& text, const std::string& source) {
  try {
    const auto j = parse_json_bounded(text, source);
    TORCH_CHECK(j.value("format", "") == kFormat, source, " is not the metadata of a sharded "
                "checkpoint (no \"format\": \"", kFormat, "\")");
    TORCH_CHECK(j.at("version").get<int>() == kVersion, source, " has format version ",
                json_excerpt(j.at("version")), "; this build reads version ", kVersion,
                " (safetensors shards); load a version-1 checkpoint (torch.save shards) with the "
                "build that wrote it and save it again");
    CheckpointMeta meta;
    meta.world_size = j.at("world_size").get<int>();
    meta.shard_group_size = j.at("shard_group_size").get<int>();
    meta.tp_size = j.value("tp_size", 1);
    meta.strategy = j.at("strategy").get<std::string>();
    meta.optimizer = j.value("optimizer", std::string("AdamW"));
    meta.optimizers = j.contains("optimizers") ? j.at("optimizers").get<std::vector<std::string>>()
                                               : std::vector<std::string>{meta.optimizer};
    TORCH_CHECK(!meta.optimizers.empty(), source, " lists no optimizers: the file was edited");
    for (const auto& p : j.at("params")) meta.params.push_back(param_from_json(p, meta));
    if (j.contains("buffers")) {
      meta.buffers.emplace();
      for (const auto& b : j.at("buffers")) meta.buffers->push_back(buffer_from_json(b));
    }
    if (j.contains("param_groups")) {
      meta.param_groups.emplace();
      for (const auto& g : j.at("param_groups")) meta.param_groups->push_back(param_group_from_json(g, meta));
    }
    for (const auto& f : j.at("files")) meta.files.push_back(parse_file_meta(f));
    meta.extra = j.at("extra");
    return meta;
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, source, " is malformed (truncated or edited?): ", e.what());
  }
}

// The saved entry named as the model's `mine` (a parameter's or a buffer's), of its shape.
template <class Meta>
const Meta& saved_like(const std::map<std::string, const Meta*>& saved, const Meta& mine, const char* kind,
                       const std::string& source) {
  auto it = saved.find(mine.name);
  TORCH_CHECK(it != saved.end(), source, " has no ", kind, " '", mine.name, "'", kOtherModel);
  TORCH_CHECK(it->second->shape == mine.shape, source, ": ", kind, " '", mine.name, "' has shape ",
              shape_text(it->second->shape), " but the model's is ", shape_text(mine.shape),
              kOtherModel);
  // A value of another dtype would be converted silently by the copy into the model.
  TORCH_CHECK(it->second->dtype == mine.dtype, source, ": ", kind, " '", mine.name, "' is ",
              it->second->dtype, " but the model's is ", mine.dtype, kOtherModel);
  return *it->second;
}

void check_buffers_match(const CheckpointMeta& meta, const std::vector<BufferMeta>& model,
                         const std::string& source) {
  if (!meta.buffers) return;  // saved before buffers were: the model keeps its own
  std::map<std::string, const BufferMeta*> saved;
  for (const auto& b : *meta.buffers) {
    TORCH_CHECK(saved.emplace(b.name, &b).second, source, " lists buffer '", b.name, "' twice");
    const bool in_a_file = std::any_of(meta.files.begin(), meta.files.end(),
                                       [&](const FileMeta& f) { return f.name == b.file; });
    TORCH_CHECK(in_a_file, source, ": buffer '", b.name, "' is in ", b.file,
                ", which is not among its files: the file was edited");
  }
  std::map<std::string, bool> known;
  for (const auto& b : model) {
    saved_like(saved, b, "buffer", source);
    known[b.name] = true;
  }
  // Name the buffer the model lacks, not only the counts.
  for (const auto& b : *meta.buffers) {
    TORCH_CHECK(known.count(b.name), source, " has buffer '", b.name,
                "' that the model does not have", kOtherModel);
  }
}

void check_matches_model(const CheckpointMeta& meta, const std::vector<ParamMeta>& model,
                         const std::string& source) {
  std::map<std::string, const ParamMeta*> saved;
  for (const auto& p : meta.params) {
    TORCH_CHECK(saved.emplace(p.name, &p).second, source, " lists parameter '", p.name, "' twice");
  }
  for (const auto& p : model) saved_like(saved, p, "parameter", source);
  if (saved.size() != model.size()) {
    std::map<std::string, bool> known;
    for (const auto& p : model) known[p.name] = true;
    for (const auto& p : meta.params) {
      TORCH_CHECK(known.count(p.name), source, " has parameter '", p.name,
                  "' that the model does not have", kOtherModel);
    }
  }
  for (const auto& file : meta.files) {
    for (const auto& piece : file.pieces) {
      TORCH_CHECK(saved.count(piece.param), source, ": ", file.name, " holds a piece of '",
                  piece.param, "', which is not among its parameters");
    }
  }
  check_coverage(meta, source);
  check_optimizer_steps(meta, source);
  check_stateless_pieces(meta, source);
}

}  // namespace fsdp
