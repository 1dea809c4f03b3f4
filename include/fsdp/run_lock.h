#pragma once
// One run per checkpoint folder.
//
// [Note: run lock]
// Two runs that save into one folder write the same step folders and `latest`, and each prunes
// the other's checkpoints: the checkpoint that `latest` names may then mix both runs' files. A
// run therefore holds DIR/run.lock for as long as it uses DIR:
// - flock(LOCK_EX | LOCK_NB) on the file decides: the kernel (or the network file system) drops
//   the lock when the holder exits or dies, so a second run is refused at once, and a crashed
//   run's lock is free again without anyone deleting anything. The file is never deleted (a
//   deleted-and-recreated lock file would let two runs hold locks on two different files).
// - The file's one line names the holder: host, pid, the pid's start time (so that a reused pid
//   is not mistaken for the holder) and when it started. A clean release empties the file.
// - When flock grants the lock but the line still names a holder (it died without releasing it),
//   the holder is checked where a pid means something: on this host, a process with its pid and
//   start time must be gone (a guard against file systems whose flock does nothing); a holder on
//   another host is gone because its flock is (a pid of another host says nothing here). The
//   lock is taken over and the caller told whom it replaced. Across hosts this needs a file
//   system whose flock is shared by its clients (NFSv4, Lustre with `flock`, GPFS, CephFS);
//   with one whose flock is local to each host (Lustre `localflock`, NFS `local_lock=flock`)
//   runs on different hosts cannot see each other's locks.
// - The file is opened without following a link (O_NOFOLLOW) and refused when it has a second
//   name (st_nlink > 1): the holder line would be written into whatever file shares it.
// - A line whose pid names no process on this host (-1, 0, 2^40, one that exited) is stale,
//   whatever its pid_start says; what a message echoes from the line is escaped and cut.

#include <string>

namespace fsdp {

class RunLock {
 public:
  /// Takes FOLDER/run.lock, creating FOLDER if it is missing. Throws naming the folder, the run
  /// that holds it (host, pid, start) and what to do, when another live run holds it, or when
  /// the lock file cannot be created (a read-only folder, a path below a file).
  explicit RunLock(const std::string& folder);
  /// Releases: empties the line (a clean end) and drops the flock.
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  /// The lock file's path.
  const std::string& path() const { return path_; }
  /// The path of FOLDER's lock file (FOLDER/run.lock), which a run into FOLDER writes.
  static std::string path_in(const std::string& folder) { return folder + "/run.lock"; }
  /// The holder line of a run that died holding the lock, when this lock took it over ("" when
  /// the lock was free).
  const std::string& taken_over_from() const { return taken_over_from_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string taken_over_from_;
};

}  // namespace fsdp
