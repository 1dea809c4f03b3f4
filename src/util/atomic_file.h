#pragma once
// A file written under a temporary name beside its target, fsynced, then renamed over it (and its
// folder fsynced): readers see the old file or the whole new one, never a part, even if the
// process dies mid-write. A writer destroyed before commit() removes its temporary file.

#include <cstddef>
#include <string>

namespace fsdp {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Appends `size` bytes; throws naming the file (disk full, I/O error).
  void write(const void* data, size_t size);
  /// fsync, rename over the target, fsync of the folder.
  void commit();

 private:
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
};

}  // namespace fsdp
