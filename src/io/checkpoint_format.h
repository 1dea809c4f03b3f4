#pragma once
// What a sharded checkpoint's metadata.json says, and the checks that need nothing but it: the
// layout-independent description of every piece (parameter name, global shape, element range
// [begin, end) of the flattened parameter) that lets any layout read any other. See
// include/fsdp/checkpoint.h for the files of a checkpoint.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

/// One parameter of the model, as saved.
struct ParamMeta {
  std::string name;                  // e.g. "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;        // global (unsharded) shape
  std::string dtype;                 // e.g. "float"
  std::optional<int64_t> step;       // the optimizer's step; empty when it counts none (SGD)
  std::vector<std::string> moments;  // its state tensors, saved per piece: "exp_avg", ...
  /// The class of the optimizer that held it ("Muon"); "" when none did. In metadata.json only
  /// when several optimizers saved ([Note: several optimizers, one checkpoint]); otherwise the
  /// file's "optimizer".
  std::string optimizer;

  int64_t numel() const;
  /// Whether the optimizer held state for it (an empty state: never stepped).
  bool has_state() const { return step.has_value() || !moments.empty(); }
};

/// One buffer of the model (BatchNorm's running_mean...), saved whole: rank 0's values, as
/// sync_buffers gives every rank, under its own name in one shard file.
struct BufferMeta {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  std::string file;     // the shard file holding it
  uint32_t crc32 = 0;   // of its bytes
};

/// Elements [begin, end) of the flattened parameter `param`, held by one file as one box of the
/// parameter ([Note: boxes of a flat shard]) under tensor_key(kind, param) for each kind. Or,
/// saved from a tensor-parallel part, a box of the parameter that is no range of its elements
/// (a column block): `offsets` and `sizes` ([Note: boxes of a tensor-parallel part]).
struct PieceMeta {
  std::string param;
  int64_t begin = 0;
  int64_t end = 0;
  std::map<std::string, uint32_t> crc32;  // kind ("param", "exp_avg", ...) -> CRC-32 of its bytes
  std::vector<int64_t> offsets;  // a box piece's, in the parameter; empty for a range piece
  std::vector<int64_t> sizes;

  bool is_box() const { return !sizes.empty(); }
  int64_t numel() const;
  /// As a message names it: "[0, 96)" or "box [0, 8] of [4, 8]".
  std::string where() const;
};

/// A piece as a box of its parameter of `shape`: a range piece's one box (none: the range is no
/// box, which open_shard_file refuses).
bool piece_box(const PieceMeta& piece, const std::vector<int64_t>& shape, std::vector<int64_t>& offsets,
               std::vector<int64_t>& sizes);

/// One shard file: its name inside the checkpoint folder, its exact size, its pieces.
struct FileMeta {
  std::string name;
  int64_t bytes = 0;
  std::vector<PieceMeta> pieces;
};

/// One param group of the optimizer, as torch.distributed.checkpoint's optimizer state dict holds
/// it: its parameters by name and its options (lr, betas...), in metadata.json's "param_groups" as
/// {"params": ["fc.weight", ...], "lr": 0.001, ...}.
struct ParamGroupMeta {
  std::vector<std::string> params;
  nlohmann::json options = nlohmann::json::object();
  std::string optimizer;  // its optimizer's class; in metadata.json only when several saved
};

struct CheckpointMeta {
  int world_size = 0;        // of the run that saved it (informative: loading needs no match)
  int tp_size = 1;           // likewise: its tensor-parallel size (absent when 1)
  int shard_group_size = 0;  // likewise
  std::string strategy;      // likewise
  std::string optimizer = "AdamW";  // whose state the params hold (absent before 0.9: AdamW); "Muon+AdamW"
  /// Each optimizer's class, in the order the program passed them: {optimizer} for one.
  std::vector<std::string> optimizers{"AdamW"};
  std::vector<ParamMeta> params;
  /// Empty when saved before buffers were saved: loading then keeps the model's own buffers.
  std::optional<std::vector<BufferMeta>> buffers;
  /// Empty when saved before the options were: loading then keeps the program's options.
  std::optional<std::vector<ParamGroupMeta>> param_groups;
  std::vector<FileMeta> files;
  nlohmann::json extra = nlohmann::json::object();  // the caller's own (step, seed...)
};

constexpr const char* kMetadataFile = "metadata.json";

/// Part `part` (0-based) of `parts` of shard `shard`'s files, in torch.distributed.checkpoint's
/// naming: "shard-00001-model-00001-of-00003.safetensors".
std::string shard_file_name(int shard, int part, int parts);
/// The safetensors key of one tensor: the parameter's own name for "param", and the names that
/// torch.distributed.checkpoint gives an optimizer's state ("state.NAME.exp_avg") for the others.
std::string tensor_key(const std::string& kind, const std::string& param);

/// A shape or offsets as a message shows them: "[48, 16]".
std::string shape_text(const std::vector<int64_t>& shape);

nlohmann::json to_json(const CheckpointMeta& meta);
nlohmann::json to_json(const FileMeta& file);
/// One entry of metadata.json's "files"; throws nlohmann::json::exception when malformed.
FileMeta parse_file_meta(const nlohmann::json& j);
/// Parses metadata.json's text; throws naming `source` and the missing or malformed field.
CheckpointMeta parse_metadata(const std::string& text, const std::string& source);

/// Throws naming `source` unless the checkpoint (when it lists buffers) holds exactly the buffers
/// of the model (names, shapes), each in one of its files.
void check_buffers_match(const CheckpointMeta& meta, const std::vector<BufferMeta>& model,
                         const std::string& source);

/// Throws naming `source` unless the checkpoint holds exactly the parameters of `model` (names,
/// shapes, dtypes) and the pieces of every parameter cover each of its elements exactly once.
void check_matches_model(const CheckpointMeta& meta, const std::vector<ParamMeta>& model,
                         const std::string& source);

}  // namespace fsdp
