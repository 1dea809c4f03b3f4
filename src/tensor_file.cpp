#include <fsdp/tensor_file.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace fsdp {

namespace {

void write_all(int fd, const std::vector<char>& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "cannot write ", path, ": ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void fsync_folder(const std::filesystem::path& folder) {
  int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the data itself was fsynced
  ::fsync(fd);
  ::close(fd);
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
  const std::filesystem::path target(path);
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create ", temporary, ": ", std::strerror(errno),
              " (does the folder exist and is it writable?)");
  try {
    write_all(fd, bytes, temporary);
    TORCH_CHECK(::fsync(fd) == 0, "cannot fsync ", temporary, ": ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    TORCH_CHECK(false, "cannot rename ", temporary, " to ", path, ": ", std::strerror(error));
  }
  fsync_folder(target.parent_path());
}

void save_tensor_dict(const std::string& path, const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.contiguous());
  write_file_atomically(path, to_torch_save_format(c10::IValue(dict)));
}

NamedTensors load_tensor_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open ", path, ": ", std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, path, " is not a readable torch.save file (truncated or corrupt?): ",
                e.what());
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
