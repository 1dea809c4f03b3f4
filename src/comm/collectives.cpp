// A process group's own c10d collectives (Gloo's all-reduce and broadcast), with failures turned
// into one error that names the peers, and the public all_reduce_sum and broadcast, which run on
// the group's own collectives (shared memory on one host, else these).
#include "comm/collectives.h"

#include "comm/host_collectives.h"
#include "util/plain_error.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace fsdp {

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Names the ranks (and hosts) this rank was waiting on: across hosts, the lost ones.
std::string describe_peers(const ProcessGroup& group, PeersWaitedOn peers) {
  const int w = group.size(), r = group.rank();
  if (peers == PeersWaitedOn::RingNeighbours) {
    return "it receives from " + group.describe_member((r - 1 + w) % w) + " and sends to " +
           group.describe_member((r + 1) % w);
  }
  std::string out;
  for (int g = 0; g < w; ++g) {
    if (g != r) out += (out.empty() ? "its peers are " : ", ") + group.describe_member(g);
  }
  return out;
}

[[noreturn]] void fail(const ProcessGroup& group, const char* what, PeersWaitedOn peers,
                       const std::string& cause) {
  // One line, no backtrace: a program that does not catch it prints just this.
  throw_plain_error("fsdp: " + std::string(what) + " on rank " + std::to_string(group.rank()) +
                    " of process group '" + group.name() + "' failed (" + describe_peers(group, peers) +
                    "): " + cause + ". A peer rank has probably died, stalled, or runs a different "
                    "model or execution order; its own log names the cause.");
}

// Device tensors go through a host copy (the group's backend is Gloo), as do non-contiguous ones.
template <class Collective>
void on_host(const at::Tensor& t, Collective&& collective) {
  if (t.is_cpu() && t.is_contiguous()) return collective(t);
  at::Tensor host = t.is_cpu() ? at::empty(t.sizes(), t.options()) : host_staging_buffer(t);
  host.copy_(t);
  collective(host);
  t.copy_(host);
}

// [Note: a Gloo collective's tensors]
// Gloo's worker thread still holds the work (and through it the tensors) for a moment after
// wait() returns, and drops it on its own thread. A tensor the caller frees would then be freed
// later, on that thread: fully_shard's check of the initial values left its checksum table
// alive past its return one time in three (Accounting.PersistentState... measures right then).
// So the caller waits until the worker has let go (bounded), and the work and its tensors are
// freed here, before the collective returns.
void wait_and_release(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout) {
  work->wait(timeout);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (work.use_count() > 1 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
}

}  // namespace

void run_guarded(const ProcessGroup& group, const char* what, PeersWaitedOn peers,
                 const std::function<void()>& collective) {
  // Gloo throws its own exception types, even when posting an operation.
  try {
    collective();
  } catch (const c10::Error& e) {
    fail(group, what, peers, e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(group, what, peers, e.what());
  }
}

void backend_all_reduce_sum(ProcessGroup& group, const at::Tensor& t) {
  if (group.size() == 1) return;
  std::vector<at::Tensor> tensors{t};
  run_guarded(group, "all_reduce", PeersWaitedOn::AllMembers,
              [&] { wait_and_release(group.backend().allreduce(tensors), group.timeout()); });
  // Gloo runs a ring all-reduce: 2(W-1)/W of the bytes leave each rank.
  count_sent_bytes(CollectiveKind::AllReduce, 2 * (group.size() - 1) * nbytes(t) / group.size());
}

void backend_broadcast(ProcessGroup& group, const at::Tensor& t, int root) {
  if (group.size() == 1) return;
  std::vector<at::Tensor> tensors{t};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run_guarded(group, "broadcast", PeersWaitedOn::AllMembers,
              [&] { wait_and_release(group.backend().broadcast(tensors, options), group.timeout()); });
  if (group.rank() == root) {
    count_sent_bytes(CollectiveKind::Broadcast, (group.size() - 1) * nbytes(t));
  }
}

void backend_all_to_all(ProcessGroup& group, const at::Tensor& received, const at::Tensor& send,
                        const std::vector<int64_t>& send_numels, const std::vector<int64_t>& receive_numels) {
  check_all_to_all(group.size(), received, send, send_numels, receive_numels);
  if (group.size() == 1) {
    received.copy_(send);
  } else {
    at::Tensor out = received, in = send.contiguous();
    run_guarded(group, "all_to_all", PeersWaitedOn::AllMembers, [&] {
      // Gloo takes the counts (it moves them into its work): it gets copies.
      std::vector<int64_t> receive_counts = receive_numels, send_counts = send_numels;
      wait_and_release(group.backend().alltoall_base(out, in, receive_counts, send_counts), group.timeout());
    });
  }
  count_all_to_all_bytes(group.rank(), send, send_numels);
}

void check_all_to_all(int members, const at::Tensor& received, const at::Tensor& send,
                      const std::vector<int64_t>& send_numels, const std::vector<int64_t>& receive_numels) {
  TORCH_CHECK(static_cast<int>(send_numels.size()) == members && static_cast<int>(receive_numels.size()) == members,
              "all_to_all: a count per member of the group is needed");
  int64_t sent = 0, got = 0;
  for (int r = 0; r < members; ++r) {
    sent += send_numels[r];
    got += receive_numels[r];
  }
  TORCH_CHECK(send.numel() == sent && received.numel() == got && received.is_contiguous(),
              "all_to_all: the buffers must hold the counts' sums (", sent, " to send, ", got, " to receive)");
}

void count_all_to_all_bytes(int rank, const at::Tensor& send, const std::vector<int64_t>& send_numels) {
  int64_t to_others = 0;
  for (size_t r = 0; r < send_numels.size(); ++r) to_others += static_cast<int>(r) == rank ? 0 : send_numels[r];
  count_sent_bytes(CollectiveKind::AllToAll, to_others * static_cast<int64_t>(send.element_size()));
}

namespace {

// A smaller segment than the units' (kShmChunkBytes): what goes through it is mostly a few bytes
// (a loss, flags, the checkpoint agreement's tables); larger tensors take more rounds.
constexpr size_t kOwnCollectivesChunkBytes = size_t{256} << 10;

// The group's own collectives, made by the first of its all_reduce_sum and broadcast (which every
// member calls, in the same order: the segment is joined as a collective).
Collectives& own_collectives(ProcessGroup& group) {
  std::shared_ptr<Collectives>& own = group.own_collectives();
  if (!own) own = host_collectives(group, kOwnCollectivesChunkBytes);
  return *own;
}

}  // namespace

void all_reduce_sum(ProcessGroup& group, const at::Tensor& t) {
  if (group.size() == 1) return;
  on_host(t, [&](const at::Tensor& host) { own_collectives(group).all_reduce_sum(host); });
}

void broadcast(ProcessGroup& group, const at::Tensor& t, int root) {
  if (group.size() == 1) return;
  on_host(t, [&](const at::Tensor& host) { own_collectives(group).broadcast(host, root); });
}

}  // namespace fsdp
