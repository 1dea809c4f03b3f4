#pragma once
// The state of one sharded model: its units (root first), the process groups of its mesh (shard
// group × replicate group), the collectives and the communication thread they share, the rate
// limiter, the forward order that drives prefetching, and the end-of-backward callback that the
// root queues on the autograd engine.

#include "collectives.h"
#include "device.h"
#include "param_group.h"
#include "rate_limiter.h"

#include <memory>
#include <vector>

namespace fsdp {

class FsdpState {
 public:
  /// Builds the mesh over `world`: shard groups of F consecutive ranks, replicated W/F times;
  /// communication for parameters on `device`.
  FsdpState(ProcessGroup& world, FullyShardOptions options, const c10::Device& device);
  ~FsdpState();

  /// Collectives inside this rank's shard group (all-gather, reduce-scatter).
  Collectives& collectives() { return *shard_collectives_; }
  /// All-reduce across the replicas of this rank's shard; null when there is one replica.
  Collectives* replicate_collectives() { return replicate_collectives_.get(); }
  ProcessGroup& world() { return world_; }
  ProcessGroup& shard_group() { return *shard_group_; }
  Device& device() { return *device_; }
  c10::Device compute_device() const { return device_->device(); }
  RateLimiter& limiter() { return limiter_; }
  const FullyShardOptions& options() const { return options_; }
  bool no_sync() const { return no_sync_; }
  void set_no_sync(bool no_sync) { no_sync_ = no_sync; }
  /// The dtype gradients are reduced in, for a unit whose unsharded gradient is in `grad_dtype`.
  c10::ScalarType reduce_dtype(c10::ScalarType grad_dtype) const;
  /// (pre, post): gradients reduced in `dtype` are divided by `pre` before the sum and by `post`
  /// after; pre*post = W.
  std::pair<double, double> gradient_divide_factors(c10::ScalarType dtype) const;
  std::vector<std::shared_ptr<ParamGroup>>& groups() { return groups_; }
  const std::vector<std::shared_ptr<ParamGroup>>& groups() const { return groups_; }

  /// Called by every unit's pre-forward: records the forward order (the root starts an iteration)
  /// and, in the first iteration with check_execution_order, checks it against the other ranks.
  void before_unit_forward(ParamGroup& group);
  /// Forward prefetch: issue the all-gather of the unit that ran after `group` last iteration.
  void prefetch_forward_after(ParamGroup& group);
  /// Backward prefetch: issue the all-gather of the unit whose backward comes after `group`'s,
  /// i.e. the one that ran before it in this iteration's forward.
  void prefetch_backward_after(ParamGroup& group);
  /// Called from the root's pre-backward hook: queue finish_backward() on the autograd engine.
  void queue_finish_backward();

 private:
  void finish_backward();
  void check_execution_order(const ParamGroup& group, size_t index);

  ProcessGroup& world_;
  std::shared_ptr<ProcessGroup> shard_group_;      // the world itself unless hybrid / no-shard
  std::shared_ptr<ProcessGroup> replicate_group_;  // null with a single replica
  std::unique_ptr<Collectives> shard_collectives_;
  std::unique_ptr<Collectives> replicate_collectives_;
  FullyShardOptions options_;
  RateLimiter limiter_;
  std::vector<std::shared_ptr<ParamGroup>> groups_;  // groups_[0] is the root unit
  std::vector<ParamGroup*> forward_order_;           // this iteration, units without the root
  std::vector<ParamGroup*> previous_forward_order_;  // the last iteration's
  bool finish_queued_ = false;
  bool no_sync_ = false;  // inside a NoSyncGuard: keep unsharded gradients, reduce nothing
  bool order_checked_ = false;  // the first iteration's order was compared across ranks
  std::string order_key_;       // store prefix of this model's order check
  std::unique_ptr<Device> device_;  // last: its work finishes first, before the buffers it uses go away
};

}  // namespace fsdp
