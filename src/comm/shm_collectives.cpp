#include "comm/shm_collectives.h"

#include "comm/shm_segment.h"
#include "util/copy_bytes.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace fsdp {

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

// to <- x + y for n floats: the single rounding of ATen's add (bitwise its result), as a plain
// loop (in small collectives ATen's dispatch and iterator cost more than the additions); outputs
// larger than kStreamingOutputBytes are streamed.
void add_floats(float* to, const float* x, const float* y, int64_t n, bool streaming) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (streaming && reinterpret_cast<uintptr_t>(to) % 16 == 0) {
    for (; i + 8 <= n; i += 8) {
      _mm_stream_ps(to + i, _mm_add_ps(_mm_loadu_ps(x + i), _mm_loadu_ps(y + i)));
      _mm_stream_ps(to + i + 4, _mm_add_ps(_mm_loadu_ps(x + i + 4), _mm_loadu_ps(y + i + 4)));
    }
    for (; i < n; ++i) to[i] = x[i] + y[i];
    _mm_sfence();
    return;
  }
#endif
  for (; i < n; ++i) to[i] = x[i] + y[i];
}

// out <- a + b, elementwise: add_floats in fp32, ATen's add otherwise.
void sum_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b, bool streaming) {
  if (out.scalar_type() == at::kFloat) {
    add_floats(out.data_ptr<float>(), a.const_data_ptr<float>(), b.const_data_ptr<float>(), out.numel(),
               streaming);
    return;
  }
  at::add_out(out, a, b);
}

class ShmCollectives final : public Collectives {
 public:
  ShmCollectives(ProcessGroup& group, std::unique_ptr<ShmSegment> segment)
      : group_(group), segment_(std::move(segment)) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

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
      if (w == 2 && full.scalar_type() == at::kFloat) {
        reduce_pair_of_floats(shard, full, s, first, n, piece);
      } else {
        reduce_in_ring_order(shard.narrow(0, first, n), full, s, first, n, piece);
      }
      segment_->end_round();
    }
    count_sent_bytes(CollectiveKind::ReduceScatter, (w - 1) * s * es);
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

  // How many elements fit in a half slot split into `pieces` (64-byte aligned pieces).
  int64_t elements_per_round(int64_t element_size, int pieces) const {
    const int64_t piece_bytes = static_cast<int64_t>(segment_->half_bytes()) / pieces / 64 * 64;
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

  // out <- the sum of elements [first, first + n) of this rank's chunk over the ranks, in the
  // ring's order: it starts from rank r+1's value and adds r+2, ..., r+w-1, and this rank's own
  // value last (fp32 and bf16 additions do not associate: another order changes bits).
  void reduce_in_ring_order(at::Tensor out, const at::Tensor& full, int64_t s, int64_t first,
                            int64_t n, int64_t piece) {
    const int w = size(), r = rank();
    const int64_t es = full.element_size();
    auto from = [&](int k) {
      const int peer = (r + k) % w;
      return peer_piece(peer, piece_index(r, peer) * piece * es, n, full, "reduce_scatter_sum");
    };
    const at::Tensor own = shard_of(full, r, s).narrow(0, first, n);
    const bool streaming = s * es >= kStreamingOutputBytes;
    if (w == 2) {
      sum_into(out, from(1), own, streaming);
      return;
    }
    // The partial sum lives in full's chunk of rank r+1, free scratch once copied in (`out` may
    // be `own` itself, which is added last).
    at::Tensor partial = shard_of(full, (r + 1) % w, s).narrow(0, first, n);
    at::add_out(partial, from(1), from(2));
    for (int k = 3; k < w; ++k) partial.add_(from(k));
    sum_into(out, partial, own, streaming);
  }

  // reduce_in_ring_order's sum for two ranks in fp32 (the peer's value plus this rank's own), on
  // pointers alone: in small units, making the tensors cost more than the additions.
  void reduce_pair_of_floats(const at::Tensor& shard, const at::Tensor& full, int64_t s, int64_t first,
                             int64_t n, int64_t piece) {
    const int r = rank(), peer = 1 - r;
    const uint8_t* theirs = segment_->wait_published(peer, "reduce_scatter_sum") +
                            piece_index(r, peer) * piece * static_cast<int64_t>(sizeof(float));
    add_floats(shard.data_ptr<float>() + first, reinterpret_cast<const float*>(theirs),
               full.const_data_ptr<float>() + r * s + first, n,
               s * static_cast<int64_t>(sizeof(float)) >= kStreamingOutputBytes);
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

  ProcessGroup& group_;
  std::unique_ptr<ShmSegment> segment_;
};

}  // namespace

bool all_on_one_host(const ProcessGroup& group) {
  const auto& hosts = group.hosts();
  return !hosts.empty() &&
         std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });
}

std::unique_ptr<Collectives> make_shm_collectives(ProcessGroup& group, size_t chunk_bytes,
                                                  std::string* why_not) {
  auto segment = ShmSegment::join(group, chunk_bytes, why_not);
  if (!segment) return nullptr;
  return std::make_unique<ShmCollectives>(group, std::move(segment));
}

}  // namespace fsdp
