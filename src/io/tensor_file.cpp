#include <fsdp/tensor_file.h>

#include <fsdp/error_text.h>
#include <fsdp/file_checks.h>

#include "util/atomic_file.h"
#include "util/crc32.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <limits>

namespace fsdp {

namespace {

uint64_t little_endian(const std::vector<char>& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

// torch.save files are zip archives whose records carry a CRC-32 that the reader does not check:
// a damaged tensor would load and train to NaN. Checks every stored record's CRC-32 against the
// central directory (ZIP64 included); throws naming the record. A file that is not a zip at all
// is left to the reader, which says so.
void check_zip_crcs(const std::vector<char>& bytes, const std::string& path) {
  const size_t n = bytes.size();
  auto u = [&](size_t at, int width) -> uint64_t {
    TORCH_CHECK(at + width <= n, path, " is truncated or corrupt (a zip record runs past the end "
                "of the file); re-create it with torch.save");
    return little_endian(bytes, at, width);
  };
  // End of central directory: the last 22+ bytes (a comment may follow it).
  size_t eocd = std::string::npos;
  for (size_t at = n >= 22 ? n - 22 : 0; n >= 22; --at) {
    if (u(at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == 0 || n - at > 22 + 65535) break;
  }
  if (eocd == std::string::npos) return;
  uint64_t entries = u(eocd + 10, 2), directory = u(eocd + 16, 4);
  if ((entries == 0xFFFF || directory == 0xFFFFFFFF) && eocd >= 20 && u(eocd - 20, 4) == 0x07064b50) {
    const size_t zip64 = static_cast<size_t>(u(eocd - 20 + 8, 8));
    TORCH_CHECK(u(zip64, 4) == 0x06064b50, path, " is corrupt (bad ZIP64 directory)");
    entries = u(zip64 + 32, 8);
    directory = u(zip64 + 48, 8);
  }
  size_t at = static_cast<size_t>(directory);
  for (uint64_t e = 0; e < entries; ++e) {
    TORCH_CHECK(u(at, 4) == 0x02014b50, path, " is corrupt (its zip directory is damaged); "
                "re-create it with torch.save");
    const uint64_t method = u(at + 10, 2), crc = u(at + 16, 4);
    uint64_t size = u(at + 20, 4), raw_size = u(at + 24, 4), local = u(at + 42, 4);
    const size_t name_len = u(at + 28, 2), extra_len = u(at + 30, 2), comment_len = u(at + 32, 2);
    const std::string name(bytes.data() + at + 46, std::min(name_len, n - std::min(n, at + 46)));
    // ZIP64 extra field: the 64-bit values of the fields that hold 0xFFFFFFFF, in this order.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = u(x, 2), len = u(x + 2, 2);
      if (id == 0x0001) {
        size_t f = x + 4;
        if (raw_size == 0xFFFFFFFF) raw_size = u(f, 8), f += 8;
        if (size == 0xFFFFFFFF) size = u(f, 8), f += 8;
        if (local == 0xFFFFFFFF) local = u(f, 8);
      }
      x += 4 + len;
    }
    if (method == 0) {  // stored, as torch.save writes: the CRC is over the bytes as they are
      TORCH_CHECK(u(local, 4) == 0x04034b50, path, " is corrupt (record '", name,
                  "' has no local header); re-create it with torch.save");
      const size_t data = local + 30 + u(local + 26, 2) + u(local + 28, 2);
      TORCH_CHECK(data + size <= n, path, " is truncated (record '", name, "' runs past the end)");
      const uint32_t actual = crc32(bytes.data() + data, size);
      TORCH_CHECK(actual == crc, path, " is corrupt: the CRC-32 of its record '", name,
                  "' does not match (a damaged or partly overwritten file); re-create it with "
                  "torch.save");
    }
    at += 46 + name_len + extra_len + comment_len;
  }
}

// torch.save's zip format, like torch::pickle_save but without TorchScript's type tags on the
// dict: Python's torch.load (weights_only=True, its default) refuses those tags.
std::vector<char> to_torch_save_format(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> container;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    container.insert(container.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return container;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  AtomicFileWriter file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void save_tensor_dict(const std::string& path, const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  // Host copies: a file written from GPU tensors loads anywhere, as one written on a CPU.
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.cpu().contiguous());
  write_file_atomically(path, to_torch_save_format(c10::IValue(dict)));
}

NamedTensors load_tensor_dict(const std::string& path) {
  const std::vector<char> bytes = read_regular_file(path, std::numeric_limits<int64_t>::max(),
                                                    "a torch.save file");
  check_zip_crcs(bytes, path);
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, path, " is not a readable torch.save file (truncated or corrupt?): ",
                message_of(e));
  }
  TORCH_CHECK(value.isGenericDict(), path, " holds a ", value.tagKind(),
              ", not a dict of name to tensor");
  NamedTensors tensors;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), path,
                " holds an entry that is not name -> tensor");
    tensors.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return tensors;
}

}  // namespace fsdp
