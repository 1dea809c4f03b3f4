#include "comm/posted_reductions.h"

#include "comm/collectives.h"
#include "comm/ring_sum.h"
#include "util/copy_bytes.h"

#include <c10/util/Exception.h>

#include <vector>

namespace fsdp {

namespace {

constexpr const char* kPostedOp = "reduce_scatter_sum (posted)";

int64_t padded_to_line(int64_t n) { return (n + 63) / 64 * 64; }
uint8_t* start_of(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

// Wrap-safe: numbers count postings modulo 2^32.
bool after(uint32_t number, uint32_t limit) { return static_cast<int32_t>(number - limit) > 0; }

}  // namespace

std::unique_ptr<PostedReductions> PostedReductions::join(ProcessGroup& group, size_t capacity_bytes,
                                                         std::string* why_not) {
  auto segment = ShmSegment::join(group, capacity_bytes, why_not, /*slots_per_rank=*/1);
  if (!segment) return nullptr;
  return std::unique_ptr<PostedReductions>(new PostedReductions(std::move(segment)));
}

int PostedReductions::piece_index(int to, int from) const {
  const int w = segment_->group().size();
  return (to - from - 1 + w) % w;
}

int64_t PostedReductions::start_for(int64_t set_bytes) const {
  const auto capacity = static_cast<int64_t>(segment_->slot_bytes());
  if (next_ % capacity + set_bytes <= capacity) return next_;
  return (next_ / capacity + 1) * capacity;  // a posting never wraps: it starts the ring again
}

bool PostedReductions::fits(const at::Tensor& full) const {
  const int w = segment_->group().size();
  const int64_t set_bytes = padded_to_line(full.numel() / w * full.element_size()) * (w - 1);
  const auto capacity = static_cast<int64_t>(segment_->slot_bytes());
  std::lock_guard<std::mutex> lock(post_mutex_);
  if (set_bytes > capacity) return false;
  return start_for(set_bytes) + set_bytes - epoch_start_ <= capacity;
}

uint32_t PostedReductions::post(const at::Tensor& shard, const at::Tensor& full, double divide_by) {
  const int w = segment_->group().size(), r = segment_->group().rank();
  const int64_t s = shard.numel(), es = shard.element_size();
  TORCH_INTERNAL_ASSERT(full.numel() == w * s && full.is_contiguous() && shard.is_contiguous() &&
                            full.scalar_type() == shard.scalar_type(),
                        "posted reduce_scatter_sum: flat contiguous buffers of one dtype expected");
  const int64_t piece = padded_to_line(s * es), set_bytes = piece * (w - 1);
  const auto capacity = static_cast<int64_t>(segment_->slot_bytes());
  std::lock_guard<std::mutex> lock(post_mutex_);
  const int64_t start = start_for(set_bytes);
  TORCH_INTERNAL_ASSERT(start + set_bytes - epoch_start_ <= capacity, "posting past the ring (fits() said no)");
  // [start, start + set) held the postings that began before start + set - capacity: every peer
  // must have summed them (they were made before the last complete_all, so it never waits on a
  // peer that waits on this rank).
  bool overwrites = false;
  uint32_t last_overwritten = 0;
  while (!in_ring_.empty() && in_ring_.front().second < start + set_bytes - capacity) {
    last_overwritten = in_ring_.front().first;
    overwrites = true;
    in_ring_.pop_front();
  }
  if (overwrites) segment_->wait_read_by_peers(last_overwritten + 1, kPostedOp);
  uint8_t* ring = segment_->slot(r, 0) + start % capacity;
  const uint8_t* chunks = start_of(full);
  for (int to = 0; to < w; ++to) {
    if (to != r) copy_bytes(ring + piece_index(to, r) * piece, chunks + to * s * es, s * es);
  }
  if (start_of(shard) != chunks + r * s * es) copy_bytes(start_of(shard), chunks + r * s * es, s * es);
  const uint32_t number = posted_++;
  segment_->set_written(posted_);
  next_ = start + set_bytes;
  in_ring_.emplace_back(number, start);
  {
    std::lock_guard<std::mutex> pending_lock(pending_mutex_);
    pending_.push_back(Posting{number, start, shard, piece, divide_by});
  }
  count_sent_bytes(CollectiveKind::ReduceScatter, (w - 1) * s * es);
  return number;
}

void PostedReductions::complete_through(uint32_t number) {
  std::lock_guard<std::mutex> lock(complete_mutex_);
  while (true) {
    Posting posting;
    {
      std::lock_guard<std::mutex> pending_lock(pending_mutex_);
      if (pending_.empty() || after(pending_.front().number, number)) return;
      posting = pending_.front();
    }
    complete(posting);
    std::lock_guard<std::mutex> pending_lock(pending_mutex_);
    pending_.pop_front();
  }
}

void PostedReductions::complete(const Posting& posting) {
  const int w = segment_->group().size(), r = segment_->group().rank();
  const auto capacity = static_cast<int64_t>(segment_->slot_bytes());
  std::vector<const void*> peers;
  for (int k = 1; k < w; ++k) {
    const int peer = (r + k) % w;
    segment_->wait_written(peer, posting.number + 1, kPostedOp);
    peers.push_back(segment_->slot(peer, 0) + posting.start % capacity +
                    piece_index(r, peer) * posting.piece_bytes);
  }
  void* shard = posting.shard.data_ptr();
  sum_in_ring_order(shard, peers, shard, posting.shard.numel(), posting.shard.scalar_type(),
                    /*scratch=*/nullptr, /*streaming=*/false, posting.divide_by);
  segment_->set_read(posting.number + 1);
}

void PostedReductions::complete_all() {
  uint32_t posted = 0;
  {
    std::lock_guard<std::mutex> lock(post_mutex_);
    posted = posted_;
  }
  if (posted > 0) complete_through(posted - 1);
  std::lock_guard<std::mutex> lock(post_mutex_);
  epoch_start_ = next_;
}

}  // namespace fsdp
