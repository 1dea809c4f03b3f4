#pragma once
// Point-to-point messages between two members of a process group: c10d's send/recv on the
// group's own backend (Gloo), as the pipeline's activations and their gradients travel between
// consecutive stages. A failure (a dead or stalled peer, a timeout) is one error naming the peer,
// as run_guarded names a collective's.

#include <fsdp/distributed.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fsdp {

/// A send in flight. Sends do not block (a pipeline stage sends and goes on computing); wait()
/// before the step ends, so that every message has left and a lost peer is named.
class PendingSend {
 public:
  PendingSend(ProcessGroup& group, c10::intrusive_ptr<c10d::Work> work, at::Tensor held, int dst);
  void wait();

 private:
  ProcessGroup* group_;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor held_;  // the bytes being sent (a host copy of a device tensor): alive until sent
  int dst_;
};

/// Starts sending `t` (any device; contiguous or not) to member `dst` of `group` under `tag`.
PendingSend send_to(ProcessGroup& group, const at::Tensor& t, int dst, int tag);
/// Adds to comm_stats().pp_send_bytes (send_to counts every send it starts).
void count_point_to_point_bytes(int64_t bytes);
/// t <- what member `src` sent under `tag` (same element count and dtype); blocks, up to the
/// group's timeout.
void recv_from(ProcessGroup& group, const at::Tensor& t, int src, int tag);

}  // namespace fsdp
