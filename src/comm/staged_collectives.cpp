// Collectives on device tensors through host buffers ([Note: the device seam]): copy out, run the
// host collectives (rings over Gloo), copy back. NCCL refuses two ranks on one GPU; staged, W
// ranks can share one and still run the CUDA path's streams and events with real peers. The
// copies are synchronous on the caller's (the lane's) stream, so a host buffer is never reused
// while a copy from it is in flight.
#include "comm/collectives.h"

#include <ATen/ATen.h>

namespace fsdp {

namespace {

class StagedCollectives final : public Collectives {
 public:
  explicit StagedCollectives(std::unique_ptr<Collectives> host) : host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void all_gather(const at::Tensor& full, const at::Tensor& shard) override {
    at::Tensor host_full = host_staging_buffer(full);
    const int64_t s = shard.numel();
    at::Tensor host_shard = host_full.narrow(0, rank() * s, s);
    host_shard.copy_(shard);
    host_->all_gather(host_full, host_shard);
    full.copy_(host_full);
  }

  void reduce_scatter_sum(const at::Tensor& shard, const at::Tensor& full) override {
    at::Tensor host_full = host_staging_buffer(full);
    host_full.copy_(full);
    at::Tensor host_shard = host_full.narrow(0, rank() * shard.numel(), shard.numel());
    host_->reduce_scatter_sum(host_shard, host_full);
    shard.copy_(host_shard);
  }

  void all_reduce_sum(const at::Tensor& t) override {
    at::Tensor host = host_staging_buffer(t);
    host.copy_(t);
    host_->all_reduce_sum(host);
    t.copy_(host);
  }

  void broadcast(const at::Tensor& t, int root) override {
    at::Tensor host = host_staging_buffer(t);
    host.copy_(t);
    host_->broadcast(host, root);
    t.copy_(host);
  }

  void all_to_all(const at::Tensor& received, const at::Tensor& send, const std::vector<int64_t>& send_numels,
                  const std::vector<int64_t>& receive_numels) override {
    at::Tensor host_send = host_staging_buffer(send), host_received = host_staging_buffer(received);
    host_send.copy_(send);
    host_->all_to_all(host_received, host_send, send_numels, receive_numels);
    received.copy_(host_received);
  }

 private:
  std::unique_ptr<Collectives> host_;
};

}  // namespace

at::Tensor host_staging_buffer(const at::Tensor& t) {
  auto options = t.options().device(at::kCPU).pinned_memory(!t.is_cpu());
  return at::empty(t.sizes(), options);
}

std::unique_ptr<Collectives> make_staged_collectives(std::unique_ptr<Collectives> host) {
  return std::make_unique<StagedCollectives>(std::move(host));
}

}  // namespace fsdp
