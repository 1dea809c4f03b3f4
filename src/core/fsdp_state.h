#pragma once
// The state of one sharded model: its units (root first), the process groups of its mesh (shard
// group × replicate group), the collectives and the communication thread they share, the rate
// limiter, and the orchestration of its units: the execution order that drives prefetching, and


#include "comm/collectives.h"
#include "device/device.h"
#include "core/gradient_watch.h"
#include "core/gradients_reduced_hook.h"
#include "core/param_group.h"
#include "core/rate_limiter.h"
#include "core/step_conductor.h"

#include <fsdp/options.h>

#include <memory>
#include <vector>

namespace fsdp {

class FsdpState final : public UnitEvents, private StepListener {
 public:
  /// Builds the mesh over `world`: shard groups of F consecutive ranks, replicated W/F times;
  /// communication for parameters on `device`.
  FsdpState(ProcessGroup& world, FullyShardOptions options, const c10::Device& device);
  ~FsdpState() override;

  /// What every unit of this model works with.
  const UnitEnv& unit_env() const { return *unit_env_; }
  /// How its units gather and reduce, and the step's events they hear.
  UnitCollectives& unit_collectives() { return *unit_collectives_; }
  /// Collectives inside this rank's shard group (all-gather, reduce-scatter).
  Collectives& collectives() { return *shard_collectives_; }
  /// All-reduce across the replicas of this rank's shard; null when there is one replica.
  Collectives* replicate_collectives() { return replicate_collectives_.get(); }
  ProcessGroup& world() { return world_; }
  ProcessGroup& shard_group() { return *shard_group_; }
  DeviceRuntime& device() { return *device_; }
  c10::Device compute_device() const { return device_->device(); }
  const FullyShardOptions& options() const { return options_; }
  void set_no_sync(bool no_sync) { conductor_.set_no_sync(no_sync); }
  /// [Note: units held unsharded]
  void set_hold_unsharded(bool hold) { conductor_.set_hold_unsharded(hold); }
  /// Inside a SummonFullParams scope every parameter is whole and units are plain calls.
  bool full_params_held() const { return full_params_held_; }
  void set_full_params_held(bool held) { full_params_held_ = held; }
  /// The model's units, the root first.
  std::vector<std::shared_ptr<ParamGroup>>& units() { return units_; }
  const std::vector<std::shared_ptr<ParamGroup>>& units() const { return units_; }

  /// A unit's forward starts (the root's takes in parameters rebound from outside; in the first
  /// iteration with check_execution_order the order is checked against the other ranks): the
  /// conductor unshards it and prefetches the next one.
  void pre_forward(ParamGroup& unit);
  /// A unit's forward ended: its outputs are hooked for backward and the conductor reshards it
  /// unless it keeps its parameters for backward (only in training mode: `training` is the
  /// unit's module's is_training()).
  void post_forward(ParamGroup& unit, const std::vector<at::Tensor>& inputs,
                    const std::vector<at::Tensor>& outputs, bool training);

  // UnitEvents
  void gradients_reduced(ParamGroup& unit, FlatParam& flat, const CommHandle& reduction) override;

  /// Called with each unit's trainable parameters and gradient shard views as its reduction is
  /// issued (fsdp::optim::StepInBackward); empty: none.
  void set_gradients_reduced_hook(detail::GradientsReducedHook hook) { gradients_reduced_hook_ = std::move(hook); }

 private:
  void check_execution_order(const ParamGroup& unit, size_t index);
  /// A unit other than the root starts a forward: refuses it when the root was skipped.
  void check_root_is_running(const ParamGroup& unit) const;
  /// Queued on the autograd engine when the root's backward is reached.
  void finish_backward();
  /// Every buffer of the model, unit by unit, for the gradient watch.
  std::vector<WatchedBuffer> watched_buffers();
  /// The groups over which ranks hold different pieces of the gradients (none: all whole).
  std::vector<ProcessGroup*> groups_holding_pieces();
  /// Gradients scaled by each rank alone (LibTorch's clip_grad_norm_) before this forward?
  void check_gradient_scaling();

  // StepListener
  void step_begins() override;
  void forward_ends() override;
  void backward_begins() override;
  void backward_ends() override;
  void shards_may_change() override;

  ProcessGroup& world_;
  std::shared_ptr<ProcessGroup> shard_group_;      // the world itself unless hybrid / no-shard
  std::shared_ptr<ProcessGroup> replicate_group_;  // null with a single replica
  std::unique_ptr<Collectives> shard_collectives_;
  std::unique_ptr<Collectives> replicate_collectives_;
  std::unique_ptr<UnitCollectives> unit_collectives_;
  FullyShardOptions options_;
  RateLimiter limiter_;
  std::unique_ptr<UnitEnv> unit_env_;
  std::vector<std::shared_ptr<ParamGroup>> units_;  // units_[0] is the root
  StepConductor conductor_;
  detail::GradientsReducedHook gradients_reduced_hook_;
  GradientWatch gradient_watch_;
  bool finish_queued_ = false;
  bool full_params_held_ = false;  // inside a SummonFullParams scope
  bool order_checked_ = false;  // the first iteration's order was compared across ranks
  std::string order_key_;       // store prefix of this model's order check
  std::unique_ptr<DeviceRuntime> device_;  // last: its work finishes first, before the buffers it uses go away
};

}  // namespace fsdp
