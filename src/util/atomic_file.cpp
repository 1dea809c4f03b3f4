#include "util/atomic_file.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

namespace fsdp {

namespace {

void fsync_folder(const std::filesystem::path& folder) {
  int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the data itself was fsynced
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temporary_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd_ >= 0, "cannot create ", temporary_, ": ", std::strerror(errno),
              " (does the folder exist and is it writable?)");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, "cannot write ", temporary_, ": ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  TORCH_CHECK(::fsync(fd_) == 0, "cannot fsync ", temporary_, ": ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    TORCH_CHECK(false, "cannot rename ", temporary_, " to ", path_, ": ", std::strerror(error));
  }
  fsync_folder(std::filesystem::path(path_).parent_path());
}

}  // namespace fsdp
