#pragma once
// One FSDP unit at run time: its flat parameter, its state machine, and the moments of the
// paper's section 3.3: unshard before forward, reshard after, unshard before backward, reduce
// the gradient and reshard as soon as backward has produced it. Communication is submitted to the
// model's DeviceRuntime ([Note: the device seam]). Which unit runs when (execution order, prefetching,
// the end of backward) is the model's (FsdpState): it calls a unit; a unit tells it what
// happened through UnitEvents and calls nothing above it.

#include "comm/comm_thread.h"
#include "core/flat_param.h"
#include "core/unit_env.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

class ParamGroup;

/// What a unit reports to the model it belongs to, on the compute thread.
class UnitEvents {
 public:
  virtual ~UnitEvents() = default;
  /// The first gradient reached one of `unit`'s outputs: its backward is next. The model then
  /// unshards it (prefetching another) and calls begin_backward.
  virtual void backward_reached(ParamGroup& unit) = 0;
  /// `unit`'s unsharded gradient is complete; its reduction is issued next.
  virtual void gradient_ready(ParamGroup& unit) = 0;
  /// `unit`'s reduced gradient is issued into its gradient shard (`reduction`; an empty handle
  /// when it is there already): wait_host() on it, and the shard holds this backward's gradient.
  virtual void gradients_reduced(ParamGroup& unit, const CommHandle& reduction) = 0;
};

/// Where the unit's parameters live.
enum class ShardedState {
  Sharded,     ///< only this rank's shard; parameters are views of it
  Unsharding,  ///< the full buffer is allocated and its all-gather is in flight
  Unsharded,   ///< the full buffer is gathered; parameters are views of it in their shapes
};

/// Where the unit is in the current backward pass.
enum class BackwardState {
  Idle,          ///< no backward under way for this unit
  Accumulating,  ///< unsharded for backward; each gradient autograd makes goes into the full buffer
  Reducing,      ///< parameters resharded; the gradient's reduce-scatter is in flight
  Reduced,       ///< parameters resharded; the gradient shard holds the gradient (no reduction)
};

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  ParamGroup(std::string name, FlatParam flat, UnitEnv env, UnitEvents& events, bool is_root);

  /// Called once after construction: installs the gradient hooks (needs shared_from_this).
  void install_grad_hooks();

  /// The other flat parameters of the same unit, gathered together with this one and counted as
  /// part of it by the rate limiter: its frozen parameters (requires_grad false: no gradient
  /// buffer, no reduction, freed when the unit's input gradient is complete), and, under mixed
  /// precision, those kept in full precision (BatchNorm: see [Note: full-precision modules]),
  /// which get their gradients, reduce them in their own dtype and reshard by themselves.
  void attach_part(std::shared_ptr<ParamGroup> part);
  const std::vector<std::shared_ptr<ParamGroup>>& parts() const { return parts_; }
  /// This group's parameters stay in their own dtype under mixed precision, reductions included.
  void keep_full_precision() { full_precision_ = true; }

  /// Forward starts: issues this unit's all-gather (wait_unshard waits for it).
  void begin_forward();
  /// Issues the all-gather if the unit is sharded (a prefetch passes `optional`: the rate
  /// limiter may refuse it). Returns false if refused.
  bool issue_unshard(bool optional);
  /// Waits for the all-gather (issuing it if needed): the parameters are usable.
  void wait_unshard();
  /// Forward ended. `inputs`: the unit's input tensors (a unit without trainable parameters
  /// learns from their gradients that its backward is over). The parameters stay unsharded for
  /// backward unless `reshard_after_forward`.
  void post_forward(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                    bool reshard_after_forward);
  /// The model unsharded this unit for its backward: wait for it and take gradients. Under
  /// `no_sync` the unsharded gradient is kept (and added to) instead of reduced.
  void begin_backward(bool no_sync);
  /// End of backward, on the caller's thread: reduce what is still accumulating (parameters
  /// without gradient), wait for the reduce-scatter, point the gradients at the shard.
  void finish_backward();

  /// Autograd has accumulated the gradient of the flat parameter's entry `entry` (its hook).
  void on_grad_accumulated(size_t entry);
  /// Between steps: reshards the unit if a forward left it unsharded for a backward that has not
  /// started ([Note: resharding between steps]). False if its backward is under way.
  bool reshard_unless_in_backward();

  const std::string& name() const { return name_; }
  /// A unit built by fully_shard_deferred learns its module path once the whole model exists.
  void set_name(const std::string& name);
  ShardedState sharded_state() const { return sharded_state_; }
  /// Whether this unit's backward has started in the current backward pass.
  bool backward_ran() const { return backward_ran_; }
  bool is_root() const { return is_root_; }
  /// One of another group's parts: it follows its leader and is never prefetched by itself.
  bool is_part() const { return is_part_; }
  FlatParam& flat() { return flat_; }
  const FlatParam& flat() const { return flat_; }

 private:
  /// Counted by the rate limiter (slots and reductions): every unit but the root and parts.
  bool rate_limited() const { return !is_root_ && !is_part_; }
  void reshard(bool with_parts = true);
  /// Drops the gradient shards (this group's and its parts') whose gradients the optimizer cleared.
  void release_cleared_gradients();
  /// Autograd's hook on an output: the unit's backward is next.
  void pre_backward();
  /// Allocates (or keeps, under no_sync) the unsharded gradient and waits for autograd's.
  void begin_accumulating(bool no_sync);
  bool has_frozen_part() const;
  void post_backward();
  /// A unit without trainable parameters: the gradient of its inputs is complete.
  void on_input_grad();
  void issue_reduce_scatter();
  /// How this unit's gradient is reduced now (dtype, divisors, accumulation).
  ReducePlan reduce_plan() const;
  bool grads_need_no_reduction() const;
  /// Installs the post-hook on the gradient accumulator of the flat parameter's entry `entry`.
  void hook(size_t entry);

  std::string name_;
  std::string label_;  // name_, or "root": for traces
  FlatParam flat_;
  UnitEnv env_;
  UnitEvents& events_;
  bool is_root_;
  std::vector<std::shared_ptr<ParamGroup>> parts_;  // this unit's other flat parameters
  bool is_part_ = false;         // this group is one of another group's parts_
  bool full_precision_ = false;  // mixed precision leaves this group in its own dtype
  ShardedState sharded_state_ = ShardedState::Sharded;
  BackwardState backward_state_ = BackwardState::Idle;
  CommHandle all_gather_;
  CommHandle reduce_scatter_;
  int grads_pending_ = 0;               // trainable parameters whose gradient has not arrived
  bool accumulate_into_shard_ = false;  // the optimizer kept the previous gradient: add to it
  bool full_grad_kept_ = false;         // no_sync: the unsharded gradient survives to the next backward
  bool no_sync_ = false;                // this backward runs under no_sync
  bool holds_limiter_slot_ = false;     // counted by the rate limiter (not the root)
  bool backward_ran_ = false;           // pre_backward ran in this backward pass
  std::chrono::steady_clock::time_point span_start_;  // of the forward or backward traced
};

}  // namespace fsdp
