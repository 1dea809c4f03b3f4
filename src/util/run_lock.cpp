// One run per checkpoint folder: [Note: run lock] in include/fsdp/run_lock.h.
#include <fsdp/run_lock.h>
#include <fsdp/printable.h>

#include <fsdp/bounded_json.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fsdp {

namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxHolderBytes = 4096;  // one JSON line; more is not a holder line

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

// Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot; with the pid
// it names one process (a pid is reused, the pair is not). -1 when the process does not exist.
long long process_start_ticks(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(line.substr(paren + 2));  // field 3 (state) onwards
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3 && field == "Z") return -1;  // exited, not yet reaped: gone
    if (i == 22) return std::atoll(field.c_str());
  }
  return -1;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm {};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string holder_line() {
  const long pid = static_cast<long>(::getpid());
  return nlohmann::json{{"host", host_name()},
                        {"pid", pid},
                        {"pid_start", process_start_ticks(pid)},
                        {"started", utc_now()}}
      .dump();
}

// "host H, pid P, started T" from a holder line (or the line itself when it is not one), as a
// one-line message can show it: the line is whatever the file holds, control bytes included.
std::string describe_holder(const std::string& line) {
  std::string described;
  try {
    const auto j = parse_json_bounded(line, "the run lock's line");
    described = "host " + j.at("host").get<std::string>() + ", pid " +
                std::to_string(j.at("pid").get<long>()) + ", started " +
                j.at("started").get<std::string>();
  } catch (const std::exception&) {
    described = "'" + line + "'";
  }
  return printable(described);
}

std::string read_holder(int fd) {
  std::string text(kMaxHolderBytes, '\0');
  const ssize_t got = ::pread(fd, text.data(), text.size(), 0);
  text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

// Takes the flock, or returns the line of the run that holds it. A holder writes its line just
// after taking the flock and empties the file just before letting it go, so an empty file under
// a held flock is a run that is starting or ending: wait a moment for its line, or for the flock
// (an ending run's folder is then this run's). "" when this run has the flock.
std::string take_flock_or_read_holder(int fd, const std::string& path) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error != EWOULDBLOCK) {
      ::close(fd);
      TORCH_CHECK(false, "cannot lock ", printable(path), ": ", std::strerror(error));
    }
    if (std::string line = read_holder(fd); !line.empty()) return line;
    if (std::chrono::steady_clock::now() > give_up) return "a run that is starting or ending";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

// Whether the run named by `line` is alive on this host although flock granted the lock (a file
// system whose flock does nothing): its pid exists with the same start time. A pid that names no
// process (-1, 0, 2^40, one that exited) has no start time: with pid_start -1 it would otherwise
// match, and the line would read as a live holder forever.
bool holder_alive_on_this_host(const std::string& line) {
  try {
    const auto j = parse_json_bounded(line, "the run lock's line");
    if (j.at("host").get<std::string>() != host_name()) return false;
    const long long started = process_start_ticks(j.at("pid").get<long>());
    return started >= 0 && started == j.at("pid_start").get<long long>();
  } catch (const std::exception&) {
    return false;  // not a holder line: nobody to wait for
  }
}

[[noreturn]] void refuse(const std::string& path, const std::string& holder, const std::string& why) {
  TORCH_CHECK(false, "checkpoint folder ", printable(fs::path(path).parent_path().string()),
              " is in use by another run (", describe_holder(holder), "; lock file ", printable(path), why,
              "). Two runs in one folder overwrite each other's checkpoints: wait until that run "
              "ends, stop it, or use another folder");
}

// A lock file with another name (a hard link) is another file's content too: the holder line
// would be written into it (a data file linked there), and a `cp -al` snapshot of a checkpoint
// folder, which shares run.lock with its original, would read as held by the original's run.
void check_single_name(int fd, const std::string& path, const struct stat& info) {
  if (info.st_nlink <= 1) return;
  ::close(fd);
  TORCH_CHECK(false, "the lock file ", printable(path), " has ", info.st_nlink, " names (hard links): "
              "it is shared with another file, whose content a run would overwrite (a `cp -al` "
              "snapshot of a checkpoint folder shares run.lock with its original); remove this "
              "name (rm ", printable(path), "): the run then creates a lock file of its own");
}

int open_lock_file(const std::string& folder, const std::string& path) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  TORCH_CHECK(!ec, "checkpoint folder ", printable(folder), ": cannot create it: ", ec.message());
  // O_NOFOLLOW: a link would lead the holder line into whatever file it names.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  TORCH_CHECK(fd >= 0, "cannot open the lock file ", printable(path), ": ", std::strerror(errno),
              errno == ELOOP ? " (it is a symbolic link; remove it)" : "",
              " (the checkpoint folder must be a writable folder)");
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    TORCH_CHECK(false, "the lock file ", printable(path), " is not a regular file; remove it");
  }
  check_single_name(fd, path, info);
  return fd;
}

}  // namespace

RunLock::RunLock(const std::string& folder) : path_(path_in(folder)) {
  fd_ = open_lock_file(folder, path_);
  if (const std::string holder = take_flock_or_read_holder(fd_, path_); !holder.empty()) {
    ::close(fd_);
    refuse(path_, holder, "");
  }
  const std::string previous = read_holder(fd_);
  if (!previous.empty()) {
    if (holder_alive_on_this_host(previous)) {
      ::close(fd_);
      refuse(path_, previous, "; its flock is free: does this file system support flock?");
    }
    taken_over_from_ = describe_holder(previous);
  }
  const std::string line = holder_line() + "\n";
  const bool written = ::ftruncate(fd_, 0) == 0 &&
                       ::pwrite(fd_, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
  if (!written) {
    const int error = errno;
    ::close(fd_);
    TORCH_CHECK(false, "cannot write the lock file ", printable(path_), ": ", std::strerror(error));
  }
  ::fsync(fd_);
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);  // a clean end: nobody to take over from
  ::close(fd_);                                // drops the flock
}

}  // namespace fsdp
