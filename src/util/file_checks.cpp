#include <fsdp/file_checks.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace fsdp {

namespace {

namespace fs = std::filesystem;

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor unless released: every early throw leaves nothing open.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  int release() { return std::exchange(fd_, -1); }
  int get() const { return fd_; }

 private:
  int fd_;
};

bool is_inside(const fs::path& path, const fs::path& folder) {
  const fs::path relative = path.lexically_relative(folder);
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& what, int64_t* bytes) {
  FdGuard fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  TORCH_CHECK(fd.get() >= 0, "cannot open ", path, " (", what, "): ", std::strerror(errno));
  struct stat info {};
  TORCH_CHECK(::fstat(fd.get(), &info) == 0, "cannot stat ", path, ": ", std::strerror(errno));
  TORCH_CHECK(S_ISREG(info.st_mode), path, " is ", kind_of(info.st_mode), ", not a regular file: ",
              what, " must be a regular file (reading a FIFO blocks until a writer appears, a "
              "device never ends); replace it with the file itself");
  const int flags = ::fcntl(fd.get(), F_GETFL);
  TORCH_CHECK(flags >= 0 && ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) == 0, "cannot set ",
              path, " to blocking reads: ", std::strerror(errno));
  *bytes = static_cast<int64_t>(info.st_size);
  return fd.release();
}

std::vector<char> read_regular_file(const std::string& path, int64_t max_bytes,
                                    const std::string& what) {
  int64_t size = 0;
  FdGuard fd(open_regular_file(path, what, &size));
  TORCH_CHECK(size <= max_bytes, path, " is ", size, " bytes, more than the ", max_bytes, " that ",
              what, " can hold: it is not one, or it is damaged (it was not read); replace it "
              "with the file its writer wrote");
  std::vector<char> out(static_cast<size_t>(size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "cannot read ", path, ": ", std::strerror(errno));
    if (n == 0) break;  // shortened since fstat: the parser reports what is missing
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

void check_relative_name(const std::string& name, const std::string& source) {
  const fs::path path(name);
  const bool parent = std::any_of(path.begin(), path.end(), [](const fs::path& part) {
    return part == "..";
  });
  const char* broken = name.empty() ? "it is empty"
                       : path.is_absolute() ? "it is an absolute path"
                       : parent ? "it has a '..' component, which leaves the folder"
                                : nullptr;
  TORCH_CHECK(broken == nullptr, source, " names '", name, "': ", broken, ". A file named in ",
              source, " must lie inside its folder (a relative name without '..'); edit ", source,
              " or restore it from a good copy");
}

void check_name_inside(const std::string& folder, const std::string& name,
                       const std::string& source) {
  check_relative_name(name, source);
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(folder, ec);
  TORCH_CHECK(!ec, "cannot resolve ", folder, ": ", ec.message());
  const fs::path resolved = fs::weakly_canonical(fs::path(folder) / name, ec);
  TORCH_CHECK(!ec, "cannot resolve ", folder, "/", name, " (named in ", source, "): ", ec.message());
  TORCH_CHECK(is_inside(resolved, base), source, " names '", name, "', which a link leads out of ",
              base.string(), " (to ", resolved.string(), "): a file named in ", source,
              " must lie inside its folder; replace the link with the file itself, or restore the "
              "folder from a good copy");
}

}  // namespace fsdp
