#include "comm/published_shards.h"

#include "comm/collectives.h"
#include "util/copy_bytes.h"

#include <c10/util/Exception.h>

namespace fsdp {

namespace {

int64_t bytes_of_shard(const at::Tensor& shard) { return shard.numel() * shard.element_size(); }

}  // namespace

std::unique_ptr<PublishedShards> PublishedShards::join(ProcessGroup& group,
                                                       const std::vector<at::Tensor>& shards,
                                                       std::string* why_not) {
  const int w = group.size();
  std::vector<int64_t> offsets, shard_bytes;
  int64_t board = 0;
  for (const at::Tensor& shard : shards) {
    const int64_t bytes = bytes_of_shard(shard);
    const bool admitted = shard.is_cpu() && shard.is_contiguous() && bytes * w <= kPublishedUnitBytes &&
                          board + bytes <= kPublishedBoardBytes;
    offsets.push_back(admitted ? board : -1);
    shard_bytes.push_back(bytes);
    // Each unsharded buffer on cache lines of its own (W times a multiple of 64 bytes).
    if (admitted) board += (bytes + 63) / 64 * 64;
  }
  if (board == 0) return nullptr;  // nothing to publish: not a failure
  // A board of W·board bytes per generation: W slots' worth of each of the two regions.
  auto segment = ShmSegment::join(group, static_cast<size_t>(board), why_not, /*slots_per_rank=*/2);
  if (!segment) return nullptr;
  return std::unique_ptr<PublishedShards>(
      new PublishedShards(std::move(segment), std::move(offsets), std::move(shard_bytes), board));
}

void PublishedShards::publish(const std::vector<at::Tensor>& shards) {
  TORCH_INTERNAL_ASSERT(shards.size() == offsets_.size(), "publish: the shards differ from the board's");
  if (published_) segment_->end_round();  // this rank uses the current generation no more
  segment_->begin_write("publishing shards");  // nor does any peer the one before it
  const int w = segment_->group().size(), r = segment_->group().rank();
  uint8_t* next = board();
  for (size_t i = 0; i < shards.size(); ++i) {
    if (offsets_[i] >= 0) copy_bytes(next + w * offsets_[i] + r * shard_bytes_[i], shards[i].data_ptr(), shard_bytes_[i]);
  }
  segment_->publish();
  published_ = true;
}

uint8_t* PublishedShards::unsharded(size_t index) {
  TORCH_INTERNAL_ASSERT(published_ && holds(index), "unsharded: a shard not on the board");
  const ProcessGroup& group = segment_->group();
  const int w = group.size(), r = group.rank();
  for (int k = 1; k < w; ++k) segment_->wait_published((r + k) % w, "all_gather (published shards)");
  // What the gather it replaces would have sent.
  count_sent_bytes(CollectiveKind::AllGather, (w - 1) * shard_bytes_[index]);
  return board() + w * offsets_[index];
}

}  // namespace fsdp
