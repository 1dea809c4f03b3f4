#pragma once
// Shards published for a whole forward and backward ([Note: decoupled collectives] in
// shm_collectives.cpp): when the root's forward starts, each rank copies its small units' shards
// into a board in a shared-memory segment, at their places in the units' unsharded buffers (all
// ranks write one board per generation, side by side), and a unit's all-gather becomes a pointer
// to its unsharded buffer on the board, without waiting for the peers to reach that unit and
// without a copy.

#include "comm/shm_segment.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

/// Shards whose unit's unsharded buffer is larger than this are not published: a board for them
/// would hold the model's parameters twice more in /dev/shm, for collectives whose bandwidth, not
/// their meeting, is the cost. (Units of 0.8 MB, bench's small, still gain: 0.98 × the step.)
constexpr int64_t kPublishedUnitBytes = 4 << 20;
/// At most this many bytes of shards per rank and board (the first units' that fit).
constexpr int64_t kPublishedBoardBytes = 16 << 20;

class PublishedShards {
 public:
  /// Collective over `group` (all on this host): boards for those of `shards` (this rank's; the
  /// same count, sizes and dtypes on every rank) that kPublishedUnitBytes and
  /// kPublishedBoardBytes admit. nullptr on every rank when none is admitted, or when the segment
  /// could not be set up (then `why_not` says why).
  static std::unique_ptr<PublishedShards> join(ProcessGroup& group, const std::vector<at::Tensor>& shards,
                                               std::string* why_not);

  /// The root's forward starts: copies this rank's admitted `shards` (as at join) to their places
  /// on the board of the next generation (two boards alternate), once every peer has published
  /// the previous generation, i.e. uses the one before it no more. This rank must use the
  /// current generation's board no more either (nothing points into it).
  void publish(const std::vector<at::Tensor>& shards);
  /// Whether shard `index` is on the board.
  bool holds(size_t index) const { return index < offsets_.size() && offsets_[index] >= 0; }
  /// Shard `index`'s unsharded buffer on the current generation's board (1-D, W·S: rank i's
  /// shard at [i·S, (i+1)·S), as all_gather lays it out), once each peer has published it. Valid
  /// until the next publish; nobody may write it.
  uint8_t* unsharded(size_t index);
  /// The bytes of the admitted shards (per rank and board).
  int64_t board_bytes() const { return board_bytes_; }

 private:
  PublishedShards(std::unique_ptr<ShmSegment> segment, std::vector<int64_t> offsets,
                  std::vector<int64_t> shard_bytes, int64_t board_bytes)
      : segment_(std::move(segment)),
        offsets_(std::move(offsets)),
        shard_bytes_(std::move(shard_bytes)),
        board_bytes_(board_bytes) {}

  uint8_t* board() const { return segment_->region(static_cast<int>(segment_->round() % 2)); }

  std::unique_ptr<ShmSegment> segment_;  // round n = generation n, on region n % 2
  std::vector<int64_t> offsets_;      // per shard, its offset in one rank's share of a board
                                      // (its unsharded buffer starts at W times it); -1: not admitted
  std::vector<int64_t> shard_bytes_;  // per shard
  int64_t board_bytes_;
  bool published_ = false;  // a generation is current
};

}  // namespace fsdp
