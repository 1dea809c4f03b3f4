#include <fsdp/safetensors.h>

#include <fsdp/bounded_json.h>
#include <fsdp/checked_math.h>
#include <fsdp/file_checks.h>

#include "util/atomic_file.h"
#include "util/crc32.h"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <fcntl.h>
#include <unistd.h>

namespace fsdp {

namespace {

// safetensors' dtype names and ours; the format stores every element little-endian, as this
// (x86-64/aarch64) host does.
const std::vector<std::pair<std::string, at::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<std::string, at::ScalarType>> names = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return names;
}

// A header larger than this is not a header (safetensors' own reader refuses above 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void fail_file(const std::string& path, const std::string& cause) {
  TORCH_CHECK(false, path, " is not a valid safetensors file: ", cause,
              " (a truncated copy or a damaged file: copy or save it again)");
}

at::ScalarType safetensors_dtype(const std::string& name, const std::string& path,
                                 const std::string& tensor) {
  for (const auto& [text, dtype] : dtype_names()) {
    if (text == name) return dtype;
  }
  fail_file(path, "tensor '" + tensor + "' has dtype '" + name +
                      "', which fsdp-cpp does not read (F64, F32, F16, BF16, I64..I8, U8, BOOL)");
}

void read_exactly(int fd, void* out, size_t size, int64_t offset, const std::string& path) {
  char* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, bytes + done, size - done, offset + static_cast<int64_t>(done));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "cannot read ", path, ": ", std::strerror(errno));
    TORCH_CHECK(n > 0, path, " ended early (at byte ", offset + static_cast<int64_t>(done),
                "): the file was truncated after it was opened");
    done += static_cast<size_t>(n);
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The bytes that `shape` x `dtype` need, or nothing when they exceed what int64 counts: a header
// may claim any shape, and a product that wraps around could match a small span.
std::optional<int64_t> bytes_of(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  return checked_product(shape, static_cast<int64_t>(c10::elementSize(dtype)));
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& j,
                             const std::string& path) {
  SafetensorsEntry entry;
  entry.name = name;
  int64_t end = 0;
  try {
    entry.dtype = safetensors_dtype(j.at("dtype").get<std::string>(), path, name);
    entry.shape = j.at("shape").get<std::vector<int64_t>>();
    const auto offsets = j.at("data_offsets").get<std::vector<int64_t>>();
    if (offsets.size() != 2) fail_file(path, "tensor '" + name + "' has no [begin, end] offsets");
    entry.offset = offsets[0];
    end = offsets[1];
  } catch (const nlohmann::json::exception& e) {
    fail_file(path, "the header entry of tensor '" + name + "' is malformed (" + e.what() + ")");
  }
  for (int64_t size : entry.shape) {
    if (size < 0) fail_file(path, "tensor '" + name + "' has a negative size in its shape");
  }
  const std::string span = "[" + std::to_string(entry.offset) + ", " + std::to_string(end) + ")";
  if (entry.offset < 0 || end < entry.offset) {
    fail_file(path, "the header says tensor '" + name + "' spans bytes " + span +
                        ", which is not a range of the data");
  }
  entry.bytes = end - entry.offset;
  const std::optional<int64_t> expected = bytes_of(entry.shape, entry.dtype);
  if (!expected) {
    fail_file(path, "tensor '" + name + "' has shape " + shape_text(entry.shape) + " of " +
                        safetensors_dtype_name(entry.dtype) + ", more bytes than int64 counts " +
                        "(the header says it spans bytes " + span + ")");
  }
  if (entry.bytes != *expected) {
    fail_file(path, "the header says tensor '" + name + "' spans bytes " + span +
                        ", but its shape and dtype need " + std::to_string(*expected) + " bytes");
  }
  return entry;
}

// The data section must be exactly the entries laid end to end, as safetensors itself demands.
void check_layout(std::vector<SafetensorsEntry>& entries, int64_t data_bytes,
                  const std::string& path) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  int64_t next = 0;
  for (const auto& entry : entries) {
    if (entry.offset != next) {
      fail_file(path, "the header's offsets " +
                          std::string(entry.offset < next ? "overlap" : "leave a hole") +
                          " at tensor '" + entry.name + "' (byte " +
                          std::to_string(entry.offset) + " of the data, expected " +
                          std::to_string(next) + ")");
    }
    next += entry.bytes;
  }
  if (next != data_bytes) {
    fail_file(path, "the header describes " + std::to_string(next) + " bytes of data but the "
                    "file holds " + std::to_string(data_bytes) +
                    (next > data_bytes ? " (it is truncated)" : " (trailing bytes)"));
  }
}

}  // namespace

int64_t SafetensorsEntry::numel() const { return c10::multiply_integers(shape); }

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& [text, type] : dtype_names()) {
    if (type == dtype) return text;
  }
  TORCH_CHECK(false, "safetensors cannot hold tensors of dtype ", dtype);
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = open_regular_file(path_, "a safetensors file", &file_bytes_);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger read-ahead: boxes are read whole
  if (file_bytes_ < 8) fail_file(path_, "it has " + std::to_string(file_bytes_) + " bytes, fewer than "
                                      "the 8 of its header length");
  unsigned char length_bytes[8];
  read_exactly(fd_, length_bytes, 8, 0, path_);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length_bytes[i];
  if (header_bytes > kMaxHeaderBytes || static_cast<int64_t>(header_bytes) > file_bytes_ - 8) {
    fail_file(path_, "its header length (" + std::to_string(header_bytes) + " bytes) runs past " +
                         "the end of the file (" + std::to_string(file_bytes_) + " bytes)");
  }
  std::string text(header_bytes, '\0');
  read_exactly(fd_, text.data(), header_bytes, 8, path_);
  nlohmann::json header;
  try {
    header = parse_json_bounded(text, path_ + "'s header");
  } catch (const nlohmann::json::exception& e) {
    fail_file(path_, std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail_file(path_, "its header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      try {
        metadata_ = value.get<StringMap>();
      } catch (const nlohmann::json::exception&) {
        fail_file(path_, "its __metadata__ is not a map of strings to strings");
      }
      continue;
    }
    entries_.push_back(parse_entry(name, value, path_));
  }
  check_layout(entries_, file_bytes_ - data_start, path_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    entries_[i].offset += data_start;
    index_.emplace(entries_[i].name, i);
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool SafetensorsReader::contains(const std::string& name) const { return index_.count(name) > 0; }

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), path_, " has no tensor '", name, "'");
  return entries_[it->second];
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const auto& e = entry(name);
  return read_range(name, 0, e.numel()).view(e.shape);
}

at::Tensor SafetensorsReader::read_range(const std::string& name, int64_t begin,
                                         int64_t end) const {
  auto out = torch::empty({end - begin}, torch::TensorOptions().dtype(entry(name).dtype));
  read_range_into(name, begin, out);
  return out;
}

void SafetensorsReader::read_range_into(const std::string& name, int64_t begin,
                                        const at::Tensor& out) const {
  const auto& e = entry(name);
  const int64_t count = out.numel();
  TORCH_CHECK(begin >= 0 && begin <= e.numel() && count <= e.numel() - begin, path_,
              ": elements [", begin, ", ", begin + count, ") lie outside tensor '", name, "' of ",
              e.numel(), " elements");
  TORCH_CHECK(out.is_contiguous() && out.device().is_cpu() && out.scalar_type() == e.dtype,
              "read_range_into needs a contiguous CPU tensor of ", e.dtype);
  const int64_t item = static_cast<int64_t>(c10::elementSize(e.dtype));
  read_exactly(fd_, out.data_ptr(), count * item, e.offset + begin * item, path_);
}

WrittenFile save_safetensors(const std::string& path, const NamedTensors& tensors,
                             const StringMap& metadata) {
  std::vector<at::Tensor> host;
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(name != "__metadata__" && !header.contains(name), "save_safetensors(", path,
                "): the name '", name, "' is reserved or given twice");
    host.push_back(tensor.detach().cpu().contiguous());
    const int64_t bytes = host.back().numel() * static_cast<int64_t>(host.back().element_size());
    header[name] = {{"dtype", safetensors_dtype_name(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the spec advises
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  AtomicFileWriter file(path);
  WrittenFile written;
  auto append = [&](const void* data, size_t size) {
    file.write(data, size);
    written.bytes += static_cast<int64_t>(size);
  };
  append(length, 8);
  append(text.data(), text.size());
  for (const auto& tensor : host) {
    const size_t bytes = tensor.numel() * tensor.element_size();
    append(tensor.data_ptr(), bytes);
    written.tensor_crc32.push_back(crc32(tensor.data_ptr(), bytes));
  }
  file.commit();
  return written;
}

}  // namespace fsdp
