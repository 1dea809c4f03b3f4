// c10d send/recv on a group's backend, through host tensors (the backend is Gloo), failures named.
#include "comm/point_to_point.h"

#include "comm/collectives.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp {

namespace {

// Gloo sends and receives contiguous host tensors; a device tensor goes through a host copy.
at::Tensor host_contiguous(const at::Tensor& t) {
  if (t.is_cpu()) return t.contiguous();
  at::Tensor host = host_staging_buffer(t);
  host.copy_(t);
  return host;
}

std::string with_peer(const char* what, const ProcessGroup& group, int peer) {
  return std::string(what) + " (peer " + group.describe_member(peer) + ")";
}

}  // namespace

PendingSend::PendingSend(ProcessGroup& group, c10::intrusive_ptr<c10d::Work> work, at::Tensor held, int dst)
    : group_(&group), work_(std::move(work)), held_(std::move(held)), dst_(dst) {}

void PendingSend::wait() {
  if (!work_) return;
  const std::string what = with_peer("send", *group_, dst_);
  run_guarded(*group_, what.c_str(), PeersWaitedOn::AllMembers, [&] { work_->wait(group_->timeout()); });
  work_.reset();
  held_ = at::Tensor();
}

PendingSend send_to(ProcessGroup& group, const at::Tensor& t, int dst, int tag) {
  TORCH_CHECK(dst != group.rank() && dst >= 0 && dst < group.size(), "send_to: member ", dst,
              " is not another member of process group '", group.name(), "' (", group.size(), " members)");
  std::vector<at::Tensor> tensors{host_contiguous(t)};
  c10::intrusive_ptr<c10d::Work> work;
  const std::string what = with_peer("send", group, dst);
  run_guarded(group, what.c_str(), PeersWaitedOn::AllMembers,
              [&] { work = group.backend().send(tensors, dst, tag); });
  count_point_to_point_bytes(static_cast<int64_t>(tensors[0].nbytes()));
  return PendingSend(group, std::move(work), tensors[0], dst);
}

void recv_from(ProcessGroup& group, const at::Tensor& t, int src, int tag) {
  TORCH_CHECK(src != group.rank() && src >= 0 && src < group.size(), "recv_from: member ", src,
              " is not another member of process group '", group.name(), "' (", group.size(), " members)");
  const bool direct = t.is_cpu() && t.is_contiguous();
  std::vector<at::Tensor> tensors{direct ? t : host_staging_buffer(t)};
  const std::string what = with_peer("recv", group, src);
  run_guarded(group, what.c_str(), PeersWaitedOn::AllMembers,
              [&] { group.backend().recv(tensors, src, tag)->wait(group.timeout()); });
  if (!direct) t.copy_(tensors[0]);
}

}  // namespace fsdp
