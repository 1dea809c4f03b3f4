#include "comm/shm_collectives.h"

#include "comm/posted_reductions.h"
#include "comm/publishing_collectives.h"
#include "comm/published_shards.h"
#include "comm/ring_sum.h"
#include "comm/shm_segment.h"
#include "util/copy_bytes.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

namespace fsdp {

// [Note: decoupled collectives]
// With a collective in every unit's path, each rank waits for its peers at every unit, and each
// rank's hiccups (a preemption, a slow page fault) stall the others: on a busy host the delays of
// all ranks add up, where ranks that meet once a step pay only the slowest one's. On the deep
// benchmark (48 units of 50 KB, 2 ranks on 2 cores) builds without the units' collectives ran
// 2.5 ms of a 20.6 ms step faster, without either kind alone only 0.4-0.6 ms (bench/README.md,
// "The deep configuration"). So the small units' collectives do not make the ranks meet:
//  - All-gathers read published shards (published_shards.h). A shard changes only between a
//    backward and the next forward (the optimizer, a load, an edit), so when the root's forward
//    starts each rank copies its small units' shards (kPublishedUnitBytes) to their places on a
//    board laid out as those units' unsharded buffers, every rank writing its own shard's place,
//    and the gathers of that forward and its backward (prefetches, re-gathers, recomputation)
//    point the unit's unsharded buffer at its place on the board (FlatParam::use_lent_full):
//    nothing is copied or allocated, and a gather waits only until each peer has published this
//    generation: once per forward. Two boards alternate; a rank writes generation g + 1 once
//    every peer has published g, i.e. uses g - 1 no more. When the units gather from the board,
//    which of them copy from it instead, and what happens to bytes still lent when the next
//    publication comes: [Note: gathering from the board] in core/unit_collectives.cpp, the only
//    user of these collectives (publishing_collectives.h).
//    A shard edited by hand between a forward and its backward is read in its published form by
//    the peers (as FSDP2, which does not support such edits either); an optimizer stepping in
//    backward steps a unit after its last gather of the pass, so that never matters.
//  - Reduce-scatters are posted (posted_reductions.h): a rank copies its own chunk into its
//    gradient shard and the peers' chunks into a ring of its own, frees the unsharded gradient
//    and goes on; the sum completes when the unit's handle is waited on (the end of backward, an
//    optimizer stepping in backward), divided for the mean in the same pass (as ATen's div_
//    would divide it after the sum: one division less per unit). A posting that would overwrite
//    one made since the last end of backward, which a peer may not have summed yet, runs in
//    rounds instead: a rank never waits for room on a peer that may be waiting for it.
// Both sum and copy as the rounds do: the results are the ring's bitwise, the bytes counted alike.

namespace {

// Gloo's ring all-reduce (gloo/allreduce.cc, what the ring's all_reduce_sum runs) splits the
// tensor into segments of at most 1 MiB, a whole number of them per rank, and reduces the
// chunk of rank c (segments [c·k, (c+1)·k)) along the ring c-1, c-2, ..., c. Returns how many
// elements one such chunk has.
int64_t gloo_ring_chunk_elements(int64_t numel, int64_t element_size, int world_size) {
  constexpr int64_t kGlooMaxSegmentBytes = 1 << 20;
  auto round_up = [](int64_t n, int64_t to) { return (n + to - 1) / to * to; };
  const int64_t total_bytes = numel * element_size;
  const int64_t max_segment_bytes =
      element_size * std::max<int64_t>(1, kGlooMaxSegmentBytes / element_size);
  const int64_t segments = round_up(
      std::max<int64_t>((total_bytes + max_segment_bytes - 1) / max_segment_bytes, 2 * world_size),
      world_size);
  const int64_t segment_bytes = round_up((total_bytes + segments - 1) / segments, element_size);
  return segments / world_size * segment_bytes / element_size;
}

uint8_t* bytes_of(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

// Outputs larger than this are written with non-temporal stores: they would not stay in the
// cache anyway, and the stores then neither read the destination first nor evict the segment.
constexpr int64_t kStreamingOutputBytes = 8 << 20;

// copy_bytes, or stream_bytes (non-temporal stores, no read of the destination) when `streaming`.
void copy_out(uint8_t* to, const uint8_t* from, size_t n, bool streaming) {
  if (streaming) {
    stream_bytes(to, from, n);
  } else {
    copy_bytes(to, from, n);
  }
}

class ShmCollectives final : public Collectives, public PublishingCollectives {
 public:
  ShmCollectives(ProcessGroup& group, std::unique_ptr<ShmSegment> segment)
      : group_(group), segment_(std::move(segment)) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

  // [Note: all-to-all through the segment]
  // Each round every rank writes into its slot, for each peer, the next piece of what it sends
  // that peer (at the peer's place, as reduce_scatter_sum lays its pieces out), and copies from
  // each peer's slot the next piece meant for it. The rounds are as many as the largest message
  // of any pair needs, which a first round tells every rank (one number each): then every rank
  // runs them all, also one with less to send. A copy in and a copy out per byte, against Gloo's
  // sockets over loopback (Muon's exchange: ~3 ms for 0.37 MB each way on 2 busy cores).
  void all_to_all(const at::Tensor& received, const at::Tensor& send, const std::vector<int64_t>& send_numels,
                  const std::vector<int64_t>& receive_numels) override {
    check_all_to_all(size(), received, send, send_numels, receive_numels);
    const at::Tensor in = send.contiguous();
    check_dense(in, "all_to_all");
    check_dense(received, "all_to_all");
    const int w = size(), r = rank();
    const int64_t es = in.element_size();
    const std::vector<int64_t> sent_at = offsets_of(send_numels), received_at = offsets_of(receive_numels);
    copy_bytes(bytes_of(received) + received_at[r] * es, bytes_of(in) + sent_at[r] * es, send_numels[r] * es);
    if (w > 1) {
      const int64_t piece = elements_per_round(es, w - 1);
      const int64_t most = largest_message(send_numels);
      for (int64_t first = 0; first < most; first += piece) {
        uint8_t* out = segment_->begin_write("all_to_all");
        for (int to = 0; to < w; ++to) {
          if (to == r) continue;
          copy_bytes(out + piece_index(to, r) * piece * es, bytes_of(in) + (sent_at[to] + first) * es,
                     part_of(send_numels[to], first, piece) * es);
        }
        segment_->publish();
        for (int k = 1; k < w; ++k) {
          const int peer = (r + k) % w;
          copy_bytes(bytes_of(received) + (received_at[peer] + first) * es,
                     segment_->wait_published(peer, "all_to_all") + piece_index(r, peer) * piece * es,
                     part_of(receive_numels[peer], first, piece) * es);
        }
        segment_->end_round();
      }
    }
    count_all_to_all_bytes(r, in, send_numels);
  }

  void all_gather(const at::Tensor& full, const at::Tensor& shard) override {
    const int w = size(), r = rank();
    const int64_t s = check_flat(full, shard, "all_gather");
    const int64_t es = full.element_size();
    uint8_t* own = bytes_of(full) + r * s * es;
    if (bytes_of(shard) != own) copy_bytes(own, bytes_of(shard), s * es);
    if (w == 1 || s == 0) return;
    const int64_t per_round = elements_per_round(es, 1);
    const bool streaming = full.nbytes() >= kStreamingOutputBytes;
    for (int64_t first = 0; first < s; first += per_round) {
      const size_t bytes = std::min(per_round, s - first) * es;
      copy_bytes(segment_->begin_write("all_gather"), bytes_of(shard) + first * es, bytes);
      segment_->publish();
      for (int k = 1; k < w; ++k) {
        const int peer = (r + k) % w;
        copy_out(bytes_of(full) + (peer * s + first) * es,
                 segment_->wait_published(peer, "all_gather"), bytes, streaming);
      }
      segment_->end_round();
    }
    count_sent_bytes(CollectiveKind::AllGather, (w - 1) * s * es);
  }

  void reduce_scatter_sum(const at::Tensor& shard, const at::Tensor& full) override {
    const int w = size(), r = rank();
    const int64_t s = check_flat(full, shard, "reduce_scatter_sum");
    const int64_t es = full.element_size();
    if (w == 1 || s == 0) {
      if (!shard.is_same(shard_of(full, r, s))) shard.copy_(shard_of(full, r, s));
      return;
    }
    // A round carries this rank's piece of every other rank's chunk.
    const int64_t piece = elements_per_round(es, w - 1);
    for (int64_t first = 0; first < s; first += piece) {
      const int64_t n = std::min(piece, s - first);
      uint8_t* out = segment_->begin_write("reduce_scatter_sum");
      for (int to = 0; to < w; ++to) {
        if (to == r) continue;
        copy_bytes(out + piece_index(to, r) * piece * es, bytes_of(full) + (to * s + first) * es,
                   n * es);
      }
      segment_->publish();
      std::vector<const void*> peers;
      for (int k = 1; k < w; ++k) {
        const int peer = (r + k) % w;
        peers.push_back(segment_->wait_published(peer, "reduce_scatter_sum") +
                        piece_index(r, peer) * piece * es);
      }
      // The partial sum of three or more ranks lives in full's chunk of rank r+1, free scratch
      // once copied in (`shard` may be this rank's own chunk, which is added last).
      sum_in_ring_order(bytes_of(shard) + first * es, peers, bytes_of(full) + (r * s + first) * es, n,
                        full.scalar_type(), bytes_of(full) + (((r + 1) % w) * s + first) * es,
                        s * es >= kStreamingOutputBytes);
      segment_->end_round();
    }
    count_sent_bytes(CollectiveKind::ReduceScatter, (w - 1) * s * es);
  }

  bool publish_shards(const std::vector<at::Tensor>& shards) override {
    if (!decoupling_joined_) join_decoupling(shards);
    if (!published_) return false;
    published_->publish(shards);
    return true;
  }

  void* published_unsharded(size_t index) override {
    return published_ && published_->holds(index) ? published_->unsharded(index) : nullptr;
  }

  std::function<void()> reduce_scatter_sum_posted(const at::Tensor& shard, const at::Tensor& full,
                                                  double divide_by) override {
    if (!posted_ || !shard.is_cpu() || !posted_->fits(full)) {
      reduce_scatter_sum(shard, full);  // in rounds, at once
      if (divide_by != 1.0) shard.div_(divide_by);
      return {};
    }
    const uint32_t number = posted_->post(shard, full, divide_by);
    return [posted = posted_.get(), number] { posted->complete_through(number); };
  }

  void complete_posted() override {
    if (posted_) posted_->complete_all();
  }

  void all_reduce_sum(const at::Tensor& t) override {
    const int w = size();
    if (w == 1) return;
    check_dense(t, "all_reduce_sum");
    const at::Tensor flat = t.view({-1});
    const int64_t numel = flat.numel(), es = flat.element_size();
    const int64_t gloo_chunk = gloo_ring_chunk_elements(numel, es, w);
    const int64_t per_round = elements_per_round(es, 1);
    for (int64_t first = 0; first < numel; first += per_round) {
      const int64_t n = std::min(per_round, numel - first);
      copy_bytes(segment_->begin_write("all_reduce_sum"), bytes_of(flat) + first * es, n * es);
      segment_->publish();
      // Each piece of the round within one of Gloo's chunks, summed in that chunk's order.
      for (int64_t begin = first; begin < first + n;) {
        const int64_t c = begin / gloo_chunk;
        const int64_t end = std::min(first + n, (c + 1) * gloo_chunk);
        reduce_in_gloo_order(flat.narrow(0, begin, end - begin), static_cast<int>(c % w),
                             (begin - first) * es);
        begin = end;
      }
      segment_->end_round();
    }
    count_sent_bytes(CollectiveKind::AllReduce, 2 * (w - 1) * numel * es / w);
  }

  void broadcast(const at::Tensor& t, int root) override {
    const int w = size();
    if (w == 1) return;
    check_dense(t, "broadcast");
    const int64_t bytes = t.numel() * t.element_size();
    const int64_t per_round = elements_per_round(1, 1);
    for (int64_t first = 0; first < bytes; first += per_round) {
      const size_t n = std::min(per_round, bytes - first);
      if (rank() == root) {
        copy_bytes(segment_->begin_write("broadcast"), bytes_of(t) + first, n);
        segment_->publish();
      } else {
        copy_out(bytes_of(t) + first, segment_->wait_published(root, "broadcast"), n,
                 bytes >= kStreamingOutputBytes);
      }
      segment_->end_round();
    }
    if (rank() == root) count_sent_bytes(CollectiveKind::Broadcast, (w - 1) * bytes);
  }

 private:
  static at::Tensor shard_of(const at::Tensor& full, int i, int64_t s) { return full.narrow(0, i * s, s); }

  static int64_t check_flat(const at::Tensor& full, const at::Tensor& shard, const char* op) {
    TORCH_INTERNAL_ASSERT(full.dim() == 1 && shard.dim() == 1 && full.is_contiguous() &&
                              shard.is_contiguous() && full.is_cpu() && shard.is_cpu(),
                          op, ": flat contiguous CPU buffers expected");
    TORCH_INTERNAL_ASSERT(full.scalar_type() == shard.scalar_type(), op, ": dtypes differ");
    return shard.numel();
  }

  static void check_dense(const at::Tensor& t, const char* op) {
    TORCH_CHECK(t.is_cpu() && t.is_contiguous(), "fsdp: ", op,
                " (shared memory) takes a contiguous CPU tensor; call .contiguous() first");
  }

  static std::vector<int64_t> offsets_of(const std::vector<int64_t>& numels) {
    std::vector<int64_t> offsets(numels.size(), 0);
    for (size_t i = 1; i < numels.size(); ++i) offsets[i] = offsets[i - 1] + numels[i - 1];
    return offsets;
  }

  // Elements of a message of `numel` in the round that starts at element `first`.
  static int64_t part_of(int64_t numel, int64_t first, int64_t piece) {
    return std::clamp<int64_t>(numel - first, 0, piece);
  }

  // The largest message any rank sends any peer: a round of one number from each rank.
  int64_t largest_message(const std::vector<int64_t>& send_numels) {
    int64_t most = 0;
    for (int to = 0; to < size(); ++to) most = to == rank() ? most : std::max(most, send_numels[to]);
    std::memcpy(segment_->begin_write("all_to_all"), &most, sizeof(most));
    segment_->publish();
    for (int k = 1; k < size(); ++k) {
      int64_t theirs = 0;
      std::memcpy(&theirs, segment_->wait_published((rank() + k) % size(), "all_to_all"), sizeof(theirs));
      most = std::max(most, theirs);
    }
    segment_->end_round();
    return most;
  }

  // How many elements fit in a slot split into `pieces` (64-byte aligned pieces).
  int64_t elements_per_round(int64_t element_size, int pieces) const {
    const int64_t piece_bytes = static_cast<int64_t>(segment_->slot_bytes()) / pieces / 64 * 64;
    return std::max<int64_t>(1, piece_bytes / element_size);
  }

  // Where, in the slot of rank `from`, its piece of rank `to`'s chunk lies: the other ranks in
  // ring order after `from`.
  int piece_index(int to, int from) const { return (to - from - 1 + size()) % size(); }

  at::Tensor peer_piece(int peer, int64_t offset_bytes, int64_t n, const at::Tensor& like,
                        const char* op) {
    auto* data = const_cast<uint8_t*>(segment_->wait_published(peer, op)) + offset_bytes;
    return at::from_blob(data, {n}, like.options());
  }

  // out <- the sum over ranks of their slot bytes at `offset_bytes`, in Gloo's ring order for
  // chunk c: rank c-1's value, plus c-2's, ..., plus c's.
  void reduce_in_gloo_order(at::Tensor out, int c, int64_t offset_bytes) {
    const int w = size();
    auto from = [&](int k) {
      return peer_piece((c - k + 2 * w) % w, offset_bytes, out.numel(), out, "all_reduce_sum");
    };
    at::add_out(out, from(1), from(2));
    for (int k = 3; k <= w; ++k) out.add_(from(k));
  }

  // At the first publication (the same moment on every rank): the board of published shards,
  // and a ring for posted reduce-scatters that holds a whole backward's gradients of the units
  // on the board twice over (postings that wrap waste room), up to kPostedRingBytes. Either stays
  // null on every rank when it cannot be set up, and its collectives run in rounds.
  void join_decoupling(const std::vector<at::Tensor>& shards) {
    decoupling_joined_ = true;
    std::string why_not;
    published_ = PublishedShards::join(group_, shards, &why_not);
    if (published_) {
      const auto ring_bytes =
          std::min(kPostedRingBytes, static_cast<size_t>(2 * (size() - 1) * published_->board_bytes()));
      posted_ = PostedReductions::join(group_, ring_bytes, &why_not);
    }
    if (!why_not.empty() && rank() == 0) {
      std::cerr << "fsdp: warning: decoupled collectives for process group '" << group_.name()
                << "' are unavailable (" << why_not << "); units' collectives run in rounds" << std::endl;
    }
  }

  ProcessGroup& group_;
  std::unique_ptr<ShmSegment> segment_;
  bool decoupling_joined_ = false;
  std::unique_ptr<PublishedShards> published_;
  std::unique_ptr<PostedReductions> posted_;
};

}  // namespace

bool all_on_one_host(const ProcessGroup& group) {
  const auto& hosts = group.hosts();
  return !hosts.empty() &&
         std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });
}

PublishingCollectives* publishing_side(Collectives& collectives) {
  return dynamic_cast<ShmCollectives*>(&collectives);
}

std::unique_ptr<Collectives> make_shm_collectives(ProcessGroup& group, size_t chunk_bytes,
                                                  std::string* why_not) {
  auto segment = ShmSegment::join(group, chunk_bytes, why_not);
  if (!segment) return nullptr;
  return std::make_unique<ShmCollectives>(group, std::move(segment));
}

}  // namespace fsdp
