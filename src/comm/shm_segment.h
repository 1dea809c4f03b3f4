#pragma once
// A POSIX shared-memory segment that the ranks of one process group on one host map together, and
// the rounds in which they exchange data through it ([Note: shared-memory collectives] in
// host_collectives.cpp says when it is used).
//
// Layout: a control block per rank (two counters the other ranks wait on: how many items it has
// written, how many it has finished reading), then K slots per rank that only its own rank
// writes. The collectives step through numbered rounds together: in round n a rank writes slot
// n % K once every peer has finished round n - K (begin_write), publishes it, reads the peers'
// slots of round n once they have published them, and ends the round. With K = 2 (double
// buffering) a rank fills round n + 1 while its peers still read round n. Protocols of their own
// (posted_reductions.h) use the counters and slots directly.

#include <fsdp/distributed.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fsdp {

/// Names of segments start with this (in /dev/shm, for as long as they are being set up).
constexpr const char* kShmSegmentPrefix = "fsdp-coll-";

class ShmSegment {
 public:
  /// Collective over `group` (all its ranks on this host): rank 0 creates a segment under a fresh
  /// random name (after removing segments whose creator is gone), the name goes through the
  /// group's store, every rank maps it, and once all have it is unlinked, so that nothing is left
  /// behind however the ranks end. Returns nullptr on every rank when any rank could not map it
  /// (`why_not` says which and why); throws naming the ranks that never arrived.
  static std::unique_ptr<ShmSegment> join(ProcessGroup& group, size_t slot_bytes,
                                          std::string* why_not, int slots_per_rank = 2);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const ProcessGroup& group() const { return group_; }
  size_t slot_bytes() const { return slot_bytes_; }
  int slots_per_rank() const { return slots_; }
  /// The name it was created under (already unlinked).
  const std::string& name() const { return name_; }

  /// This rank's slot of the current round, once every peer has finished reading it K rounds
  /// ago. `op` names the collective in errors.
  uint8_t* begin_write(const char* op);
  /// Tells the peers that this rank's slot of the current round is written.
  void publish();
  /// `peer`'s slot of the current round, once it has published it.
  const uint8_t* wait_published(int peer, const char* op);
  /// This rank has read everything it needs of the current round; the next round starts.
  void end_round();
  /// Rounds this rank has ended.
  uint32_t round() const { return round_; }

  /// For a protocol in rounds whose ranks write one buffer together rather than a slot each
  /// (published_shards.h): the slot area seen as slots_per_rank regions of W slots' bytes;
  /// round n writes region n % K. Don't mix with slot().
  uint8_t* region(int index) const;

  // The counters and slots themselves, for a protocol that is not in rounds (don't mix the two).
  uint8_t* slot(int rank, int index) const;
  /// Tells the peers that this rank has written `count` items.
  void set_written(uint32_t count);
  /// Tells the peers that this rank has finished reading `count` items.
  void set_read(uint32_t count);
  /// Waits until `peer` has written `count` items.
  void wait_written(int peer, uint32_t count, const char* op);
  /// Waits until every peer has finished reading `count` items.
  void wait_read_by_peers(uint32_t count, const char* op);

 /// One rank's sequence numbers (defined in shm_segment.cpp).
  struct RankControl;

 private:
  ShmSegment(ProcessGroup& group, std::string name, uint8_t* base, size_t bytes, size_t slot_bytes,
             int slots_per_rank);

  RankControl& control(int rank) const;
  void announce_this_rank();
  /// Waits until `word` of `peer` reaches `target` (wrap-safe): spins a few microseconds, then
  /// sleeps on the futex, checking that the peer lives and the group's timeout.
  void wait_until(int peer, std::atomic<uint32_t>& word, uint32_t target, const char* op);
  void store_and_wake(std::atomic<uint32_t>& word, uint32_t value);
  bool peer_exited(int peer) const;
  [[noreturn]] void fail(const char* op, int peer, const std::string& cause) const;

  ProcessGroup& group_;
  std::string name_;
  uint8_t* base_;
  size_t bytes_;
  size_t slot_bytes_;
  int slots_;
  uint32_t round_ = 0;
};

}  // namespace fsdp
