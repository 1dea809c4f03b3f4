#include "io/checkpoint_read.h"

#include <fsdp/bounded_json.h>

#include "util/crc32.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <filesystem>

namespace fsdp::detail {

namespace {

// The fix of a shard file that disagrees with metadata.json.
constexpr const char* kIntact = "resume from an intact copy of the checkpoint (or an earlier one)";

// The tensor `key` that metadata.json places in `file`: named when it is not there (the reader's
// own message names neither metadata.json nor the fix).
const SafetensorsEntry& listed_entry(const SafetensorsReader& file, const std::string& key,
                                     const std::string& what) {
  TORCH_CHECK(file.contains(key), file.path(), " has no tensor '", key, "' but ", kMetadataFile,
              " lists it (", what, "): the file was edited or replaced; ", kIntact);
  return file.entry(key);
}

// One saved tensor of `kind` of a piece, whole, read into `out` (contiguous, its size) and checked
// against its CRC-32 in metadata.json.
void read_checked_into(const SafetensorsReader& file, const PieceMeta& piece,
                       const std::string& kind, const at::Tensor& out) {
  const std::string key = tensor_key(kind, piece.param);
  file.read_range_into(key, 0, out);
  auto expected = piece.crc32.find(kind);
  TORCH_CHECK(expected != piece.crc32.end(), file.path(), ": ", kMetadataFile,
              " has no CRC-32 of tensor '", key, "' (an edited or incomplete metadata file)");
  const uint32_t actual = crc32(out.data_ptr(), out.nbytes());
  TORCH_CHECK(actual == expected->second, file.path(), ": tensor '", key, "' has CRC-32 ", actual,
              " but ", kMetadataFile, " says ", expected->second, ": the file is corrupt; ", kIntact);
}

at::Tensor read_checked(const SafetensorsReader& file, const PieceMeta& piece,
                        const std::string& kind) {
  const auto& entry = file.entry(tensor_key(kind, piece.param));
  at::Tensor data = at::empty({entry.numel()}, at::TensorOptions().dtype(entry.dtype));
  read_checked_into(file, piece, kind, data);
  return data;
}

// The file's DCP_SHARDING_INFO (each tensor's "saved_offsets" in the full tensor): what
// PyTorch's HuggingFaceStorageReader places the tensors by.
nlohmann::json sharding_info(const SafetensorsReader& file) {
  const auto it = file.metadata().find("DCP_SHARDING_INFO");
  TORCH_CHECK(it != file.metadata().end(), file.path(), " has no DCP_SHARDING_INFO in its "
              "header's __metadata__ (where PyTorch's reader places its tensors): it was not "
              "saved by fsdp-cpp or was edited");
  const nlohmann::json info = fsdp::parse_json_bounded(it->second, file.path() + "'s DCP_SHARDING_INFO");
  TORCH_CHECK(info.is_object(), file.path(), ": its DCP_SHARDING_INFO is not a JSON object: the "
              "file was edited or is corrupt");
  return info;
}

// The tensor `entry` holds one box of `param` ([Note: boxes of a flat shard], [Note: boxes of a
// tensor-parallel part]): its shape in the header and its offsets in DCP_SHARDING_INFO must be
// that box's, or fsdp-cpp (which reads by metadata.json) and PyTorch's reader (by
// DCP_SHARDING_INFO) would disagree.
void check_box(const SafetensorsReader& file, const nlohmann::json& info,
               const SafetensorsEntry& entry, const ParamMeta& param, const PieceMeta& piece) {
  std::vector<int64_t> offsets, sizes;
  const bool is_box = piece_box(piece, param.shape, offsets, sizes);
  TORCH_CHECK(is_box && sizes == entry.shape, file.path(), ": tensor '",
              entry.name, "' has shape ", shape_text(entry.shape), " in the header, but ",
              kMetadataFile, "'s piece ", piece.where(), " of '", param.name,
              "' (shape ", shape_text(param.shape), ") is ",
              is_box ? "the box " + shape_text(sizes) : std::string("no box"),
              ": the file was edited or is corrupt");
  const nlohmann::json saved = info.contains(entry.name) && info[entry.name].is_object()
                                   ? info[entry.name].value("saved_offsets", nlohmann::json())
                                   : nlohmann::json();
  TORCH_CHECK(saved == nlohmann::json(offsets), file.path(), ": DCP_SHARDING_INFO "
              "places tensor '", entry.name, "' at ", saved.is_null() ? "no offsets" : saved.dump().substr(0, 40),
              " but ", kMetadataFile, "'s piece ", piece.where(), " is at ",
              shape_text(offsets), ": the file was edited or is corrupt");
}

// The part of box (`offsets`, `sizes`) that [lo, hi) per dimension selects, of a tensor holding
// that box.
at::Tensor sub_box(at::Tensor t, const std::vector<int64_t>& offsets, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi) {
  for (size_t d = 0; d < lo.size(); ++d) t = t.narrow(static_cast<int64_t>(d), lo[d] - offsets[d], hi[d] - lo[d]);
  return t;
}

}  // namespace

PieceIndex index_pieces(const CheckpointMeta& meta) {
  PieceIndex index;
  for (size_t f = 0; f < meta.files.size(); ++f) {
    for (const auto& piece : meta.files[f].pieces) index[piece.param].emplace_back(f, &piece);
  }
  return index;
}

std::unique_ptr<SafetensorsReader> open_shard_file(const std::string& folder, const FileMeta& file,
                                                   const std::map<std::string, const ParamMeta*>& params) {
  namespace fs = std::filesystem;
  const std::string path = folder + "/" + file.name;
  std::error_code ec;
  TORCH_CHECK(fs::exists(fs::symlink_status(path, ec)), "cannot open ", path,
              ": no such file (a shard file is missing: was the checkpoint copied completely?)");
  auto reader = std::make_unique<SafetensorsReader>(path);  // refuses a FIFO or a device unread
  TORCH_CHECK(reader->file_bytes() == file.bytes, path, " is ", reader->file_bytes(), " bytes but ",
              kMetadataFile, " says ", file.bytes, ": the file is truncated or was replaced");
  const nlohmann::json info = sharding_info(*reader);
  for (const auto& piece : file.pieces) {
    const ParamMeta& param = *params.at(piece.param);
    std::vector<std::string> kinds{"param"};
    if (param.has_state()) kinds.insert(kinds.end(), param.moments.begin(), param.moments.end());
    for (const auto& kind : kinds) {
      const auto& entry = listed_entry(*reader, tensor_key(kind, piece.param),
                                       "piece " + piece.where() + " of '" + piece.param + "'");
      TORCH_CHECK(entry.numel() == piece.numel() &&
                      std::string(c10::toString(entry.dtype)) == param.dtype,
                  path, ": tensor '", entry.name, "' is ", entry.dtype, " of ", entry.numel(),
                  " elements but ", kMetadataFile, " says ", param.dtype, " of ",
                  piece.numel());
      check_box(*reader, info, entry, param, piece);
    }
    if (piece.crc32.count("step")) {
      const double step = read_checked(*reader, piece, "step").item<double>();
      TORCH_CHECK(param.step && step == static_cast<double>(*param.step), path, ": tensor '",
                  tensor_key("step", piece.param), "' disagrees with ", kMetadataFile);
    }
  }
  return reader;
}

at::Tensor read_whole_checked(const SafetensorsReader& file, const BufferMeta& saved) {
  const std::string& key = saved.name;
  const auto& entry = listed_entry(file, key, "a buffer");
  // The dtype too: metadata.json's was checked against the model's, and the copy into the
  // model would convert another silently.
  TORCH_CHECK(entry.shape == saved.shape && std::string(c10::toString(entry.dtype)) == saved.dtype,
              file.path(), ": buffer '", key, "' is ", entry.dtype, " ", shape_text(entry.shape),
              " in the header but ", kMetadataFile, " says ", saved.dtype, " ",
              shape_text(saved.shape), ": the file was edited or is corrupt; ", kIntact);
  at::Tensor data = at::empty(saved.shape, at::TensorOptions().dtype(entry.dtype));
  file.read_range_into(key, 0, data.view({-1}));
  const uint32_t actual = crc32(data.data_ptr(), data.nbytes());
  TORCH_CHECK(actual == saved.crc32, file.path(), ": buffer '", key, "' has CRC-32 ", actual, " but ",
              kMetadataFile, " says ", saved.crc32, ": the file is corrupt; ", kIntact);
  return data;
}

bool overlaps(const PieceMeta& piece, const ParamMeta& param, const PlacedBox& box) {
  std::vector<int64_t> offsets, sizes;
  if (!piece_box(piece, param.shape, offsets, sizes)) return false;  // open_shard_file refuses it
  for (size_t d = 0; d < offsets.size(); ++d) {
    if (offsets[d] >= box.offsets[d] + box.sizes[d] || box.offsets[d] >= offsets[d] + sizes[d]) return false;
  }
  return true;
}

void assemble(const at::Tensor& out, int64_t out_begin, const std::vector<PlacedBox>& needed,
              const std::string& kind, const ParamMeta& param, const PieceIndex& index, const OpenFiles& files) {
  std::map<const PieceMeta*, at::Tensor> read;  // each saved piece read once, in its box's shape
  for (const PlacedBox& box : needed) {
    at::Tensor target = box.view_in(out, out_begin);
    for (const auto& [f, piece] : index.at(param.name)) {
      if (!overlaps(*piece, param, box)) continue;
      std::vector<int64_t> offsets, sizes;
      piece_box(*piece, param.shape, offsets, sizes);
      if (offsets == box.offsets && sizes == box.sizes && target.is_contiguous()) {
        read_checked_into(*files.at(f), *piece, kind, target.view({-1}));  // the same box: no copy
        continue;
      }
      at::Tensor& saved = read[piece];
      if (!saved.defined()) saved = read_checked(*files.at(f), *piece, kind).view(sizes);
      std::vector<int64_t> lo(offsets.size()), hi(offsets.size());
      for (size_t d = 0; d < offsets.size(); ++d) {
        lo[d] = std::max(offsets[d], box.offsets[d]);
        hi[d] = std::min(offsets[d] + sizes[d], box.offsets[d] + box.sizes[d]);
      }
      sub_box(target, box.offsets, lo, hi).copy_(sub_box(saved, offsets, lo, hi));
    }
  }
}

}  // namespace fsdp::detail
