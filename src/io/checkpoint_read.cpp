#include "io/checkpoint_read.h"

#include <fsdp/bounded_json.h>

#include "io/tensor_boxes.h"
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

// The tensor `entry` holds elements [begin, end) of `param` as one box ([Note: boxes of a flat
// shard]): its shape in the header and its offsets in DCP_SHARDING_INFO must be that box's, or
// fsdp-cpp (which reads by element range) and PyTorch's reader (by box) would disagree.
void check_box(const SafetensorsReader& file, const nlohmann::json& info,
               const SafetensorsEntry& entry, const ParamMeta& param, const PieceMeta& piece) {
  const std::vector<TensorBox> boxes = boxes_of_range(param.shape, piece.begin, piece.end);
  TORCH_CHECK(boxes.size() == 1 && boxes[0].sizes == entry.shape, file.path(), ": tensor '",
              entry.name, "' has shape ", shape_text(entry.shape), " in the header, but ",
              kMetadataFile, "'s piece [", piece.begin, ", ", piece.end, ") of '", param.name,
              "' (shape ", shape_text(param.shape), ") is ",
              boxes.size() == 1 ? "the box " + shape_text(boxes[0].sizes) : std::string("no box"),
              ": the file was edited or is corrupt");
  const nlohmann::json offsets = info.contains(entry.name) && info[entry.name].is_object()
                                     ? info[entry.name].value("saved_offsets", nlohmann::json())
                                     : nlohmann::json();
  TORCH_CHECK(offsets == nlohmann::json(boxes[0].offsets), file.path(), ": DCP_SHARDING_INFO "
              "places tensor '", entry.name, "' at ", offsets.is_null() ? "no offsets" : offsets.dump().substr(0, 40),
              " but ", kMetadataFile, "'s piece [", piece.begin, ", ", piece.end, ") is at ",
              shape_text(boxes[0].offsets), ": the file was edited or is corrupt");
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
                                       "piece [" + std::to_string(piece.begin) + ", " +
                                           std::to_string(piece.end) + ") of '" + piece.param + "'");
      TORCH_CHECK(entry.numel() == piece.end - piece.begin &&
                      std::string(c10::toString(entry.dtype)) == param.dtype,
                  path, ": tensor '", entry.name, "' is ", entry.dtype, " of ", entry.numel(),
                  " elements but ", kMetadataFile, " says ", param.dtype, " of ",
                  piece.end - piece.begin);
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

void assemble(const at::Tensor& out, int64_t begin, int64_t end, const std::string& kind,
              const std::string& param, const PieceIndex& index, const OpenFiles& files) {
  if (begin == end) return;
  for (const auto& [f, piece] : index.at(param)) {
    const int64_t lo = std::max(begin, piece->begin), hi = std::min(end, piece->end);
    if (lo >= hi) continue;
    if (lo == piece->begin && hi == piece->end) {  // a whole saved box (same layout): no copy
      read_checked_into(*files.at(f), *piece, kind, out.narrow(0, lo - begin, hi - lo));
      continue;
    }
    const at::Tensor saved = read_checked(*files.at(f), *piece, kind);
    out.narrow(0, lo - begin, hi - lo).copy_(saved.narrow(0, lo - piece->begin, hi - lo));
  }
}

}  // namespace fsdp::detail
