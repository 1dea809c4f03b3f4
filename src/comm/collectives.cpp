#include "comm/collectives.h"

#include <fsdp/comm_stats.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <vector>

namespace fsdp {

namespace {

struct Counters {
  std::atomic<int64_t> all_gather{0};
  std::atomic<int64_t> reduce_scatter{0};
  std::atomic<int64_t> all_reduce{0};
  std::atomic<int64_t> broadcast{0};
};

Counters& counters() {
  static Counters instance;
  return instance;
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

class RingCollectives final : public Collectives {
 public:
  explicit RingCollectives(ProcessGroup& group) : group_(group) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

  void all_gather(const at::Tensor& full, const at::Tensor& shard) override {
    const int w = size(), r = rank();
    const int64_t s = check_flat(full, shard, "all_gather");
    auto chunk = [&](int i) { return full.narrow(0, (int64_t)i * s, s); };
    if (!shard.is_same(chunk(r))) chunk(r).copy_(shard);
    if (w == 1 || s == 0) return;
    // Step k: pass on the chunk received at step k-1 (at k = 0, our own).
    for (int k = 0; k < w - 1; ++k) {
      exchange(chunk((r - k + w) % w), chunk((r - k - 1 + w) % w));
      counters().all_gather += s * full.element_size();
    }
  }

  void reduce_scatter_sum(const at::Tensor& shard, const at::Tensor& full) override {
    const int w = size(), r = rank();
    const int64_t s = check_flat(full, shard, "reduce_scatter_sum");
    auto chunk = [&](int i) { return full.narrow(0, (int64_t)i * s, s); };
    // The last step's partial sum arrives straight in `shard` and our chunk is added to it there
    // (a + b == b + a bitwise), unless `shard` shares `full`'s memory (a view of our chunk): no
    // copy-out, and at W = 2 no receive buffer at all.
    const bool into_shard = !shard.is_alias_of(full);
    if (w == 1 || s == 0) {
      if (into_shard) shard.copy_(chunk(r));
      return;
    }
    at::Tensor incoming = w > 2 || !into_shard ? at::empty({s}, full.options()) : shard;
    // Step k: send the partial sum of chunk r-k-1, add the received partial of chunk r-k-2
    // to ours. After w-1 steps chunk r holds the sum over all ranks.
    for (int k = 0; k < w - 1; ++k) {
      const int receive_index = (r - k - 2 + 2 * w) % w;
      const bool last = k == w - 2;  // receive_index == r
      exchange(chunk((r - k - 1 + w) % w), last && into_shard ? shard : incoming);
      if (last && into_shard) {
        shard.add_(chunk(r));
      } else {
        chunk(receive_index).add_(incoming);
      }
      counters().reduce_scatter += s * full.element_size();
    }
  }

  void all_reduce_sum(const at::Tensor& t) override {
    if (size() == 1) return;
    std::vector<at::Tensor> tensors{t};
    guarded("all_reduce", [&] { group_.backend().allreduce(tensors)->wait(group_.timeout()); });
    // Gloo runs a ring all-reduce: 2(W-1)/W of the bytes leave each rank.
    counters().all_reduce += 2 * (size() - 1) * nbytes(t) / size();
  }

  void broadcast(const at::Tensor& t, int root) override {
    if (size() == 1) return;
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    guarded("broadcast", [&] { group_.backend().broadcast(tensors, options)->wait(group_.timeout()); });
    if (rank() == root) counters().broadcast += (size() - 1) * nbytes(t);
  }

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
    guarded("ring exchange", [&] {
      auto send = group_.backend().send(send_list, (r + 1) % w, tag);
      auto recv = group_.backend().recv(recv_list, (r - 1 + w) % w, tag);
      recv->wait(group_.timeout());
      send->wait(group_.timeout());
    }, /*ring=*/true);
  }

  // Runs `fn`, turning whatever the backend throws (a timeout, a closed connection: Gloo throws
  // its own exception types, even when posting an operation) into one error that says what now.
  // `ring`: this rank talks to its ring neighbours only (else to every member of the group).
  template <class Fn>
  void guarded(const char* what, Fn&& fn, bool ring = false) {
    try {
      fn();
    } catch (const c10::Error& e) {
      fail(what, e.what_without_backtrace(), ring);
    } catch (const std::exception& e) {
      fail(what, e.what(), ring);
    }
  }

  // Names the ranks (and hosts) this rank was waiting on: across hosts, the lost ones.
  std::string peers(bool ring) const {
    const int w = size(), r = rank();
    if (ring) {
      return "it receives from " + group_.describe_member((r - 1 + w) % w) + " and sends to " +
             group_.describe_member((r + 1) % w);
    }
    std::string out;
    for (int g = 0; g < w; ++g) {
      if (g != r) out += (out.empty() ? "its peers are " : ", ") + group_.describe_member(g);
    }
    return out;
  }

  [[noreturn]] void fail(const char* what, const std::string& cause, bool ring) {
    TORCH_CHECK(false, "fsdp: ", what, " on rank ", rank(), " of process group '", group_.name(),
                "' failed (", peers(ring), "): ", cause,
                "\nA peer rank has probably died, stalled, or runs a different model or "
                "execution order; its own log names the cause.");
  }

  // Every rank issues the same sequence of collectives, so equal counters pair sends with
  // receives even if a later scheduler runs several collectives at once.
  int next_tag() { return static_cast<int>(tag_++ % (1 << 20)); }

  ProcessGroup& group_;
  int64_t tag_ = 0;
};

}  // namespace

void count_sent_bytes(CollectiveKind kind, int64_t bytes) {
  switch (kind) {
    case CollectiveKind::AllGather:
      counters().all_gather += bytes;
      break;
    case CollectiveKind::ReduceScatter:
      counters().reduce_scatter += bytes;
      break;
    case CollectiveKind::AllReduce:
      counters().all_reduce += bytes;
      break;
    case CollectiveKind::Broadcast:
      counters().broadcast += bytes;
      break;
  }
}

std::unique_ptr<Collectives> make_ring_collectives(ProcessGroup& group) {
  return std::make_unique<RingCollectives>(group);
}

CommStats comm_stats() {
  CommStats s;
  s.all_gather_bytes = counters().all_gather.load();
  s.reduce_scatter_bytes = counters().reduce_scatter.load();
  s.all_reduce_bytes = counters().all_reduce.load();
  s.broadcast_bytes = counters().broadcast.load();
  return s;
}

void reset_comm_stats() {
  counters().all_gather = 0;
  counters().reduce_scatter = 0;
  counters().all_reduce = 0;
  counters().broadcast = 0;
}

}  // namespace fsdp

namespace fsdp {

namespace {

// The world's small exchanges (a loss, a norm, buffers) run on Gloo, through host memory for
// device tensors.
std::unique_ptr<Collectives> world_collectives(ProcessGroup& group, const at::Tensor& t) {
  auto ring = make_ring_collectives(group);
  return t.is_cpu() ? std::move(ring) : make_staged_collectives(std::move(ring));
}

}  // namespace

void all_reduce_sum(ProcessGroup& group, const at::Tensor& t) {
  world_collectives(group, t)->all_reduce_sum(t);
}

void broadcast(ProcessGroup& group, const at::Tensor& t, int root) {
  world_collectives(group, t)->broadcast(t, root);
}

}  // namespace fsdp
