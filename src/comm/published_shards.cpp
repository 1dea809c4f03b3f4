#include "comm/published_shards.h"

#include "comm/collectives.h"
#include "util/copy_bytes.h"

#include <c10/util/Exception.h>

namespace fsdp {

namespace {

int64_t bytes_of_shard(const at::Tensor& shard) { return shard.numel() * shard.element_size(); }
uint8_t* first_byte_of(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

}  // namespace

std::unique_ptr<PublishedShards> PublishedShards::join(ProcessGroup& group,
                                                       const std::vector<at::Tensor>& shards,
                                                       std::string* why_not) {
  const int w = group.size();
  std::vector<int64_t> offsets;
  int64_t board = 0;
  for (const at::Tensor& shard : shards) {
    const int64_t bytes = bytes_of_shard(shard);
    const bool admitted = shard.is_cpu() && shard.is_contiguous() && bytes * w <= kPublishedUnitBytes &&
                          board + bytes <= kPublishedBoardBytes;
    offsets.push_back(admitted ? board : -1);
    if (admitted) board += (bytes + 63) / 64 * 64;  // each shard on cache lines of its own
  }
  if (board == 0) return nullptr;  // nothing to publish: not a failure
  auto segment = ShmSegment::join(group, static_cast<size_t>(board), why_not, /*slots_per_rank=*/2);
  if (!segment) return nullptr;
  return std::unique_ptr<PublishedShards>(new PublishedShards(std::move(segment), std::move(offsets), board));
}

void PublishedShards::publish(const std::vector<at::Tensor>& shards) {
  TORCH_INTERNAL_ASSERT(shards.size() == offsets_.size(), "publish: the shards differ from the board's");
  if (published_) segment_->end_round();  // this rank reads the previous generation no more
  uint8_t* board = segment_->begin_write("publishing shards");
  for (size_t i = 0; i < shards.size(); ++i) {
    if (offsets_[i] >= 0) copy_bytes(board + offsets_[i], shards[i].data_ptr(), bytes_of_shard(shards[i]));
  }
  segment_->publish();
  published_ = true;
}

void PublishedShards::all_gather(const at::Tensor& full, const at::Tensor& shard, size_t index) {
  TORCH_INTERNAL_ASSERT(published_ && holds(index), "all_gather of a shard not on the board");
  const ProcessGroup& group = segment_->group();
  const int w = group.size(), r = group.rank();
  const int64_t bytes = bytes_of_shard(shard);
  uint8_t* out = first_byte_of(full);
  if (first_byte_of(shard) != out + r * bytes) copy_bytes(out + r * bytes, shard.data_ptr(), bytes);
  for (int k = 1; k < w; ++k) {
    const int peer = (r + k) % w;
    copy_bytes(out + peer * bytes, segment_->wait_published(peer, "all_gather (published shards)") + offsets_[index],
               bytes);
  }
  count_sent_bytes(CollectiveKind::AllGather, (w - 1) * bytes);
}

}  // namespace fsdp
