#pragma once
/// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
/// length N, N bytes of JSON ({name: {"dtype", "shape", "data_offsets": [begin, end)}, plus an
/// optional "__metadata__" of string to string}), then the raw little-endian data. Hugging Face
/// (transformers, safetensors.safe_open) and torch.distributed.checkpoint's
/// HuggingFaceStorageReader read these files; so does SafetensorsReader, with positioned reads of
/// just the bytes asked for (a rank reads its shard, not the whole model).

#include <fsdp/tensor_file.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp {

using StringMap = std::map<std::string, std::string>;

/// One tensor of a safetensors file: where its bytes lie in the file.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // of its first byte, from the start of the file
  int64_t bytes = 0;

  int64_t numel() const;
};

/// A safetensors file opened for reading. The constructor reads only the header and checks it
/// against the file: a FIFO or a device (refused without blocking), a truncated file, a header
/// that is not JSON, an unknown dtype, offsets that overlap, leave holes or disagree with a shape
/// and dtype (whose bytes are counted with overflow checks) all throw, naming the file, the tensor
/// and the cause.
///
/// Example:
///   fsdp::SafetensorsReader file("model.safetensors");
///   at::Tensor wte = file.read("wte.weight");            // whole, in its shape
///   at::Tensor rows = file.read_range("wte.weight", 0, 4096);  // elements [0, 4096), 1-D
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }
  /// In the file's order of data offsets.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const;
  /// Throws naming the file and the missing tensor.
  const SafetensorsEntry& entry(const std::string& name) const;
  /// The "__metadata__" strings (empty when the file has none).
  const StringMap& metadata() const { return metadata_; }

  /// The whole tensor, in its shape.
  at::Tensor read(const std::string& name) const;
  /// Elements [begin, end) of the flattened tensor, 1-D; reads only their bytes.
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t end) const;
  /// Elements [begin, begin + out.numel()) into `out` (contiguous CPU, the entry's dtype).
  void read_range_into(const std::string& name, int64_t begin, const at::Tensor& out) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  StringMap metadata_;
};

/// What save_safetensors wrote: the file's size and the CRC-32 (IEEE, as Python's zlib.crc32) of
/// each tensor's bytes, in the order given.
struct WrittenFile {
  int64_t bytes = 0;
  std::vector<uint32_t> tensor_crc32;
};

/// Writes `tensors` (any shape; copied to host if needed) as a safetensors file with `metadata` in
/// "__metadata__": to a temporary name, fsynced, then renamed over `path`, so a crash mid-write
/// leaves the previous file intact. Streams each tensor's bytes without copying the whole file.
WrittenFile save_safetensors(const std::string& path, const NamedTensors& tensors,
                             const StringMap& metadata = {});

/// "F32", "BF16", ... (safetensors' names); throws for a dtype safetensors cannot hold.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace fsdp
