#pragma once
// Reading a checkpoint's shard files: each opened file checked against metadata.json (its size,
// its tensors' names, sizes and dtypes) and every tensor read checked against its CRC-32, and the
// elements a rank needs assembled from the saved pieces that overlap them, whatever layout saved
// them.

#include <fsdp/safetensors.h>

#include "io/checkpoint_format.h"
#include "io/global_boxes.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::detail {

/// The shard files a rank reads, by index in metadata.json's list.
using OpenFiles = std::map<size_t, std::unique_ptr<SafetensorsReader>>;

/// Where each saved piece lives: by parameter, (file index, piece).
using PieceIndex = std::map<std::string, std::vector<std::pair<size_t, const PieceMeta*>>>;

PieceIndex index_pieces(const CheckpointMeta& meta);

/// Opens `folder`/file.name (reading its header) and checks it against its description: its
/// size, then every piece's tensors (present, the right number of elements and dtype; AdamW's
/// step its saved value). `params`: metadata.json's parameters by name.
std::unique_ptr<SafetensorsReader> open_shard_file(const std::string& folder, const FileMeta& file,
                                                   const std::map<std::string, const ParamMeta*>& params);

/// The buffer `saved` whole from `file`, checked against its shape, dtype and CRC-32 in
/// metadata.json.
at::Tensor read_whole_checked(const SafetensorsReader& file, const BufferMeta& saved);

/// Whether the saved `piece` of `param` holds elements of `box`.
bool overlaps(const PieceMeta& piece, const ParamMeta& param, const PlacedBox& box);

/// `out` (1-D, elements [out_begin, ...) of this rank's flattened part of `param`) <- in each of
/// the `needed` boxes (boxes_in_whole of that range), the saved tensors of `kind` of the pieces
/// that overlap it, which check_matches_model proved cover it exactly once; `files` holds every
/// file those pieces are in.
void assemble(const at::Tensor& out, int64_t out_begin, const std::vector<PlacedBox>& needed,
              const std::string& kind, const ParamMeta& param, const PieceIndex& index, const OpenFiles& files);

}  // namespace fsdp::detail
