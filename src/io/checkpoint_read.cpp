#include "io/checkpoint_read.h"

#include "util/crc32.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <filesystem>

namespace fsdp::detail {

namespace {

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
              " but ", kMetadataFile, " says ", expected->second, ": the file is corrupt");
}

at::Tensor read_checked(const SafetensorsReader& file, const PieceMeta& piece,
                        const std::string& kind) {
  const auto& entry = file.entry(tensor_key(kind, piece.param));
  at::Tensor data = at::empty({entry.numel()}, at::TensorOptions().dtype(entry.dtype));
  read_checked_into(file, piece, kind, data);
  return data;
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
  for (const auto& piece : file.pieces) {
    const ParamMeta& param = *params.at(piece.param);
    std::vector<std::string> kinds{"param"};
    if (param.step) kinds.insert(kinds.end(), param.moments.begin(), param.moments.end());
    for (const auto& kind : kinds) {
      const auto& entry = reader->entry(tensor_key(kind, piece.param));
      TORCH_CHECK(entry.numel() == piece.end - piece.begin &&
                      std::string(c10::toString(entry.dtype)) == param.dtype,
                  path, ": tensor '", entry.name, "' is ", entry.dtype, " of ", entry.numel(),
                  " elements but ", kMetadataFile, " says ", param.dtype, " of ",
                  piece.end - piece.begin);
    }
    if (piece.crc32.count("step")) {
      const double step = read_checked(*reader, piece, "step").item<double>();
      TORCH_CHECK(param.step && step == static_cast<double>(*param.step), path, ": tensor '",
                  tensor_key("step", piece.param), "' disagrees with ", kMetadataFile);
    }
  }
  return reader;
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
