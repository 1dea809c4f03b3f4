#include "comm/shm_segment.h"
#include "util/plain_error.h"

#include <c10/util/Exception.h>

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

namespace fsdp {

// One per rank, on cache lines of its own (128 bytes: the adjacent-line prefetcher pairs lines).
struct alignas(128) ShmSegment::RankControl {
  std::atomic<uint32_t> written{0};   // rounds this rank has published into its slot
  std::atomic<uint32_t> read{0};      // rounds this rank has finished
  std::atomic<uint32_t> sleepers{0};  // peers asleep on this rank's futex words
  std::atomic<int32_t> pid{0};
  std::atomic<uint64_t> pid_namespace{0};  // pids are comparable only within one namespace
};

namespace {
constexpr size_t kControlBytes = 128;
static_assert(sizeof(ShmSegment::RankControl) == 128, "one control block per 128 bytes");
}  // namespace

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x667364702d73686dULL;  // "fsdp-shm"
constexpr size_t kPage = 4096;
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kSleepSlice = std::chrono::milliseconds(50);

struct SegmentHeader {
  uint64_t magic;
  uint64_t world_size;
  uint64_t slot_bytes;
  uint64_t slots_per_rank;
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Page 0: the header; from page 1: the control blocks; then the slots, page-aligned.
size_t controls_offset() { return kPage; }

size_t slots_offset(int world_size) { return round_up(kPage + world_size * kControlBytes, kPage); }

size_t segment_bytes(int world_size, size_t slot_bytes, int slots_per_rank) {
  return slots_offset(world_size) + static_cast<size_t>(slots_per_rank) * world_size * slot_bytes;
}

// Wrap-safe: the counters count rounds modulo 2^32.
bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Process-shared futexes (the words live in a shared mapping): no FUTEX_PRIVATE_FLAG.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds slice) {
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(slice.count() / 1000000000);
  timeout.tv_nsec = static_cast<long>(slice.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint64_t this_pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

bool process_gone(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // A zombie has exited but is not reaped yet: field 3 of /proc/PID/stat is its state.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

std::string random_segment_name() {
  std::random_device device;
  const uint64_t token = (static_cast<uint64_t>(device()) << 32) ^ device();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(token));
  return "/" + std::string(kShmSegmentPrefix) + std::to_string(getpid()) + "-" + hex;
}

// Segments left by a job whose rank 0 died while the ranks were mapping it (the only window in
// which a segment has a name): the creator's pid is part of the name.
void remove_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string prefix = kShmSegmentPrefix;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const int pid = std::atoi(name.c_str() + prefix.size());
    if (pid > 0 && process_gone(pid)) shm_unlink(("/" + name).c_str());
  }
  closedir(dir);
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", duration.count() / 1000.0);
  return text;
}

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// Creates the segment, its memory reserved up front (a full /dev/shm is an error here, not a
// SIGBUS at the first touch), with the header initialized. Returns nullptr with `error` set.
uint8_t* create_segment(const std::string& name, int world_size, size_t slot_bytes, int slots_per_rank,
                        std::string* error) {
  const size_t bytes = segment_bytes(world_size, slot_bytes, slots_per_rank);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *error = errno_text("shm_open(" + name + ", O_CREAT)");
    return nullptr;
  }
  const int reserved = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = reserved == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                             : MAP_FAILED;
  if (reserved != 0) {
    *error = "reserving " + std::to_string(bytes >> 20) + " MiB in /dev/shm: " +
             std::strerror(reserved) + " (free space in /dev/shm, or FSDP_CPU_COLLECTIVES=ring)";
  } else if (base == MAP_FAILED) {
    *error = errno_text("mmap");
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto* header = static_cast<SegmentHeader*>(base);
  header->world_size = static_cast<uint64_t>(world_size);
  header->slot_bytes = slot_bytes;
  header->slots_per_rank = static_cast<uint64_t>(slots_per_rank);
  header->magic = kMagic;
  return static_cast<uint8_t*>(base);
}

uint8_t* map_segment(const std::string& name, int world_size, size_t slot_bytes, int slots_per_rank,
                     std::string* error) {
  const size_t bytes = segment_bytes(world_size, slot_bytes, slots_per_rank);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    *error = errno_text("shm_open(" + name + ") (is /dev/shm shared by all ranks?)");
    return nullptr;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    *error = name + " has " + std::to_string(st.st_size) + " bytes, not " + std::to_string(bytes);
  } else if ((base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    *error = errno_text("mmap");
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  const auto* header = static_cast<const SegmentHeader*>(base);
  if (header->magic != kMagic || header->world_size != static_cast<uint64_t>(world_size) ||
      header->slot_bytes != slot_bytes ||
      header->slots_per_rank != static_cast<uint64_t>(slots_per_rank)) {
    *error = name + " is not this group's segment";
    munmap(base, bytes);
    return nullptr;
  }
  return static_cast<uint8_t*>(base);
}

std::string as_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }
std::vector<uint8_t> as_bytes(const std::string& text) { return {text.begin(), text.end()}; }

// Waits for `keys` in the store; names the ranks (key index) that never wrote theirs.
void wait_for_ranks(ProcessGroup& group, const std::vector<std::string>& keys, const char* step) {
  try {
    group.store().wait(keys, group.timeout());
    return;
  } catch (const std::exception&) {
  }
  std::string missing;
  for (size_t r = 0; r < keys.size(); ++r) {
    bool present = false;
    try {
      present = group.store().check({keys[r]});
    } catch (const std::exception&) {
    }
    if (!present) missing += (missing.empty() ? "" : ", ") + group.describe_member(static_cast<int>(r));
  }
  TORCH_CHECK(false, "fsdp: setting up shared-memory collectives on rank ", group.rank(),
              " of process group '", group.name(), "' failed: ", missing.empty() ? "a rank" : missing,
              " did not ", step, " within ", seconds_text(group.timeout()),
              " (FSDP_TIMEOUT_SECONDS). Did it die, or does it run with another "
              "FSDP_CPU_COLLECTIVES? Its own log names the cause.");
}

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::join(ProcessGroup& group, size_t slot_bytes,
                                             std::string* why_not, int slots_per_rank) {
  const int rank = group.rank(), size = group.size();
  TORCH_INTERNAL_ASSERT(slots_per_rank >= 1, "a segment has at least one slot per rank");
  slot_bytes = round_up(std::max<size_t>(slot_bytes, kPage), kPage);
  const std::string key = group.next_store_key("fsdp_shm_segment");
  std::string name, error;
  uint8_t* base = nullptr;
  if (rank == 0) {
    remove_stale_segments();
    name = random_segment_name();
    base = create_segment(name, size, slot_bytes, slots_per_rank, &error);
    group.store().set(key + "/name", as_bytes(base ? name : "!" + error));
  } else {
    wait_for_ranks(group, {key + "/name"}, "create the segment");
    const std::string published = as_text(group.store().get(key + "/name"));
    if (published.rfind('!', 0) == 0) {
      error = "rank 0 could not create it: " + published.substr(1);
    } else {
      name = published;
      base = map_segment(name, size, slot_bytes, slots_per_rank, &error);
    }
  }
  std::unique_ptr<ShmSegment> segment;
  if (base != nullptr) {
    segment.reset(new ShmSegment(group, name, base, segment_bytes(size, slot_bytes, slots_per_rank),
                                 slot_bytes, slots_per_rank));
    segment->announce_this_rank();
  }
  // Everyone reports; once all have, nobody needs the name any more.
  std::vector<std::string> reports;
  for (int r = 0; r < size; ++r) reports.push_back(key + "/mapped/" + std::to_string(r));
  group.store().set(reports[rank], as_bytes(error.empty() ? "ok" : error));
  try {
    wait_for_ranks(group, reports, "map the segment");
  } catch (...) {
    if (!name.empty()) shm_unlink(name.c_str());
    throw;
  }
  if (!name.empty()) shm_unlink(name.c_str());  // every rank: the first one removes it
  std::string failures;
  for (int r = 0; r < size; ++r) {
    const std::string report = as_text(group.store().get(reports[r]));
    if (report != "ok") failures += (failures.empty() ? "" : "; ") + group.describe_member(r) + ": " + report;
  }
  if (failures.empty()) return segment;
  if (why_not) *why_not = failures;
  return nullptr;
}

ShmSegment::ShmSegment(ProcessGroup& group, std::string name, uint8_t* base, size_t bytes,
                       size_t slot_bytes, int slots_per_rank)
    : group_(group),
      name_(std::move(name)),
      base_(base),
      bytes_(bytes),
      slot_bytes_(slot_bytes),
      slots_(slots_per_rank) {}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

ShmSegment::RankControl& ShmSegment::control(int rank) const {
  return *reinterpret_cast<RankControl*>(base_ + controls_offset() + rank * kControlBytes);
}

uint8_t* ShmSegment::slot(int rank, int index) const {
  return base_ + slots_offset(group_.size()) +
         (static_cast<size_t>(slots_) * rank + index) * slot_bytes_;
}

uint8_t* ShmSegment::region(int index) const {
  return base_ + slots_offset(group_.size()) + static_cast<size_t>(index) * group_.size() * slot_bytes_;
}

void ShmSegment::announce_this_rank() {
  control(group_.rank()).pid_namespace.store(this_pid_namespace());
  control(group_.rank()).pid.store(getpid());
}

uint8_t* ShmSegment::begin_write(const char* op) {
  // Round n reuses the slot of round n - K: every peer must have ended that one.
  wait_read_by_peers(round_ - slots_ + 1, op);
  return slot(group_.rank(), static_cast<int>(round_ % slots_));
}

void ShmSegment::publish() { set_written(round_ + 1); }

const uint8_t* ShmSegment::wait_published(int peer, const char* op) {
  wait_written(peer, round_ + 1, op);
  return slot(peer, static_cast<int>(round_ % slots_));
}

void ShmSegment::end_round() {
  set_read(round_ + 1);
  ++round_;
}

void ShmSegment::set_written(uint32_t count) { store_and_wake(control(group_.rank()).written, count); }

void ShmSegment::set_read(uint32_t count) { store_and_wake(control(group_.rank()).read, count); }

void ShmSegment::wait_written(int peer, uint32_t count, const char* op) {
  wait_until(peer, control(peer).written, count, op);
}

void ShmSegment::wait_read_by_peers(uint32_t count, const char* op) {
  for (int peer = 0; peer < group_.size(); ++peer) {
    if (peer != group_.rank()) wait_until(peer, control(peer).read, count, op);
  }
}

void ShmSegment::store_and_wake(std::atomic<uint32_t>& word, uint32_t value) {
  word.store(value);  // seq_cst: either the sleeper sees the value, or this sees the sleeper
  if (control(group_.rank()).sleepers.load() > 0) futex_wake_all(word);
}

void ShmSegment::wait_until(int peer, std::atomic<uint32_t>& word, uint32_t target, const char* op) {
  if (reached(word.load(std::memory_order_acquire), target)) return;
  const auto spin_end = Clock::now() + kSpin;
  for (int i = 1;; ++i) {
    cpu_relax();
    if (reached(word.load(std::memory_order_acquire), target)) return;
    if (i % 64 == 0 && Clock::now() > spin_end) break;
  }
  const auto deadline = Clock::now() + group_.timeout();
  std::atomic<uint32_t>& sleepers = control(peer).sleepers;
  while (true) {
    sleepers.fetch_add(1);
    const uint32_t seen = word.load();
    if (!reached(seen, target)) {
      futex_wait(word, seen, std::min<Clock::duration>(kSleepSlice, deadline - Clock::now()));
    }
    sleepers.fetch_sub(1);
    if (reached(word.load(std::memory_order_acquire), target)) return;
    if (peer_exited(peer)) fail(op, peer, "it exited");
    if (Clock::now() >= deadline) {
      fail(op, peer, "it made no progress for " + seconds_text(group_.timeout()) +
                         " (the group's timeout, FSDP_TIMEOUT_SECONDS)");
    }
  }
}

bool ShmSegment::peer_exited(int peer) const {
  const RankControl& theirs = control(peer);
  if (theirs.pid_namespace.load() != control(group_.rank()).pid_namespace.load()) return false;
  return process_gone(theirs.pid.load());
}

void ShmSegment::fail(const char* op, int peer, const std::string& cause) const {
  // One line, no backtrace: a program that does not catch it prints just this.
  throw_plain_error("fsdp: " + std::string(op) + " (shared memory) on rank " + std::to_string(group_.rank()) +
                    " of process group '" + group_.name() + "' failed (waiting for " +
                    group_.describe_member(peer) + "): " + cause + ". A peer rank has probably died, "
                    "stalled, or runs a different model or execution order; its own log names the cause.");
}

}  // namespace fsdp
