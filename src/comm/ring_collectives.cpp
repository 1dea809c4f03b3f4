// Ring collectives over any c10d backend's send/recv: the all-gather and reduce-scatter move
// exactly (W-1)/W of the buffer per rank and step through the persistent flat buffers in place
// (Gloo's own all-gather copies through a fresh buffer, and its reduce-scatter is an all-reduce
// in disguise). The all-reduce and broadcast are the backend's own.
#include "comm/collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

namespace fsdp {

namespace {

class RingCollectives final : public Collectives {
 public:
  explicit RingCollectives(ProcessGroup& group) : group_(group) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

  void all_to_all(const at::Tensor& received, const at::Tensor& send, const std::vector<int64_t>& send_numels,
                  const std::vector<int64_t>& receive_numels) override {
    backend_all_to_all(group_, received, send, send_numels, receive_numels);
  }

  void all_gather(const at::Tensor& full, const at::Tensor& shard) override {
    const int w = size(), r = rank();
    const int64_t s = check_flat(full, shard, "all_gather");
    auto shard_of = [&](int i) { return full.narrow(0, (int64_t)i * s, s); };
    if (!shard.is_same(shard_of(r))) shard_of(r).copy_(shard);
    if (w == 1 || s == 0) return;
    // Step k: pass on the shard received at step k-1 (at k = 0, our own).
    for (int k = 0; k < w - 1; ++k) {
      exchange(shard_of((r - k + w) % w), shard_of((r - k - 1 + w) % w));
      count_sent_bytes(CollectiveKind::AllGather, s * full.element_size());
    }
  }

  void reduce_scatter_sum(const at::Tensor& shard, const at::Tensor& full) override {
    const int w = size(), r = rank();
    const int64_t s = check_flat(full, shard, "reduce_scatter_sum");
    auto shard_of = [&](int i) { return full.narrow(0, (int64_t)i * s, s); };
    // The last step's partial sum arrives straight in `shard` and our shard of `full` is added to it there
    // (a + b == b + a bitwise), unless `shard` shares `full`'s memory (a view of our shard of it): no
    // copy-out, and at W = 2 no receive buffer at all.
    const bool into_shard = !shard.is_alias_of(full);
    if (w == 1 || s == 0) {
      if (into_shard) shard.copy_(shard_of(r));
      return;
    }
    at::Tensor incoming = w > 2 || !into_shard ? at::empty({s}, full.options()) : shard;
    // Step k: send the partial sum of shard r-k-1, add the received partial of shard r-k-2
    // to ours. After w-1 steps shard r holds the sum over all ranks.
    for (int k = 0; k < w - 1; ++k) {
      const int receive_index = (r - k - 2 + 2 * w) % w;
      const bool last = k == w - 2;  // receive_index == r
      exchange(shard_of((r - k - 1 + w) % w), last && into_shard ? shard : incoming);
      if (last && into_shard) {
        shard.add_(shard_of(r));
      } else {
        shard_of(receive_index).add_(incoming);
      }
      count_sent_bytes(CollectiveKind::ReduceScatter, s * full.element_size());
    }
  }

  void all_reduce_sum(const at::Tensor& t) override { backend_all_reduce_sum(group_, t); }

  void broadcast(const at::Tensor& t, int root) override { backend_broadcast(group_, t, root); }

 private:
  static int64_t check_flat(const at::Tensor& full, const at::Tensor& shard, const char* op) {
    TORCH_INTERNAL_ASSERT(full.dim() == 1 && shard.dim() == 1 && full.is_contiguous() &&
                              shard.is_contiguous(),
                          op, ": flat contiguous buffers expected");
    TORCH_INTERNAL_ASSERT(full.scalar_type() == shard.scalar_type(), op, ": dtypes differ");
    return shard.numel();
  }

  /// Sends `out` to the next rank and receives `in` from the previous one, concurrently.
  void exchange(const at::Tensor& out, const at::Tensor& in) {
    const int w = size(), r = rank();
    const int tag = next_tag();
    std::vector<at::Tensor> send_list{out};
    std::vector<at::Tensor> recv_list{in};
    run_guarded(group_, "ring exchange", PeersWaitedOn::RingNeighbours, [&] {
      auto send = group_.backend().send(send_list, (r + 1) % w, tag);
      auto recv = group_.backend().recv(recv_list, (r - 1 + w) % w, tag);
      recv->wait(group_.timeout());
      send->wait(group_.timeout());
    });
  }

  // Every rank issues the same sequence of collectives, so equal counters pair sends with
  // receives even if a later scheduler runs several collectives at once.
  int next_tag() { return static_cast<int>(tag_++ % (1 << 20)); }

  ProcessGroup& group_;
  int64_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Collectives> make_ring_collectives(ProcessGroup& group) {
  return std::make_unique<RingCollectives>(group);
}

}  // namespace fsdp
