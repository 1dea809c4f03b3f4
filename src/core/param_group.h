#pragma once
// One FSDP unit at run time: its flat parameters, their state machine, and the moments of the
// paper's section 3.3: unshard before forward, reshard after, unshard before backward, reduce
// the gradient and reshard as soon as backward has produced it. Each flat group's all-gather and
// reduction are objects chosen when the model is built (unit_collectives.h). Which unit runs when
// (execution order, prefetching, the end of backward) is the step's conductor's ([Note: one
// schedule, two kinds of units]): a unit implements ScheduledUnit for it and calls down into it
// when autograd reaches the unit's backward and completes its gradient. What the model needs to
// hear from a unit goes through UnitEvents; a unit calls nothing above it.

#include "comm/comm_thread.h"
#include "core/flat_param.h"
#include "core/rate_limiter.h"
#include "core/step_conductor.h"
#include "core/unit_collectives.h"
#include "core/unit_env.h"
#include "core/unit_order.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

class ParamGroup;

/// What a unit reports to the model it belongs to, on the compute thread.
class UnitEvents {
 public:
  virtual ~UnitEvents() = default;
  /// The reduced gradient of `flat`, one of `unit`'s flat parameters, is issued into its gradient
  /// shard (`reduction`; an empty handle when it is there already): wait_host() on it, and the
  /// shard holds this backward's gradient.
  virtual void gradients_reduced(ParamGroup& unit, FlatParam& flat, const CommHandle& reduction) = 0;
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

/// One flat parameter of a unit and where it is in the step. A unit has one per kind of
/// parameter it holds ([Note: a unit's flat parameters]).
struct FlatGroup {
  explicit FlatGroup(FlatParam flat_param, bool keeps_full_precision)
      : flat(std::move(flat_param)), full_precision(keeps_full_precision) {}

  FlatParam flat;
  bool full_precision;  // mixed precision leaves these parameters in their own dtype
  ShardedState sharded_state = ShardedState::Sharded;
  BackwardState backward_state = BackwardState::Idle;
  std::shared_ptr<UnitGather> gather;  // how it is all-gathered (install_collectives)
  std::shared_ptr<UnitReduce> reduce;  // how its gradient is reduced
  CommHandle all_gather;
  CommHandle reduce_scatter;
  int grads_pending = 0;               // trainable parameters whose gradient has not arrived
  bool accumulate_into_shard = false;  // the optimizer kept the previous gradient: add to it
  bool full_grad_kept = false;         // no_sync: the unsharded gradient survives to the next backward
  bool params_parked = false;          // Unsharded, but the parameters point at the shard ([Note: between a forward and its backward])

  bool trainable() const { return flat.requires_grad(); }
};

// [Note: a unit's flat parameters]
// A unit's parameters are flattened by kind: trainable or frozen (requires_grad false: no
// gradient buffer, no reduction), and, under mixed precision, computed in param_dtype or kept in
// full precision (BatchNorm: [Note: full-precision modules]). The unit owns its flat groups as
// peers (FSDP2's FSDPParamGroup owns its FSDPParams so): they are gathered together, and each is
// resharded when autograd needs it no more: a trainable one once its gradients are complete, a
// frozen one once the gradient of the unit's inputs is (a frozen layer's input gradient may come
// after every trainable layer's). The unit holds one rate-limiter slot while any of them is
// unsharded, and its first flat group (trainable in param_dtype, when it has such parameters)
// is its main one: the one whose reduction the limiter counts and whose completed gradient
// starts a BACKWARD_POST prefetch ([Note: one order inside a unit]).

class ParamGroup final : public ScheduledUnit,
                         private UnitMoments,
                         public std::enable_shared_from_this<ParamGroup> {
 public:
  /// `flats`: at least one (a unit without parameters has one empty flat parameter), the first
  /// holding trainable parameters when the unit has any.
  ParamGroup(std::string name, std::vector<FlatGroup> flats, UnitEnv env, UnitEvents& events, bool is_root);
  ParamGroup(const ParamGroup&) = delete;
  ParamGroup& operator=(const ParamGroup&) = delete;

  /// Called once after construction: installs the gradient hooks (needs shared_from_this).
  void install_grad_hooks();
  /// Called once after construction: each flat group's all-gather and reduction, from the
  /// model's `collectives`; `pass_only` as UnitCollectives::gather takes it.
  void install_collectives(UnitCollectives& collectives, const std::function<bool()>& pass_only);

  // ScheduledUnit
  /// Forward starts: issues this unit's all-gathers (wait_unshard waits for them).
  void begin_forward() override;
  bool issue_unshard(bool optional) override;
  /// Waits for the all-gathers (issuing them if needed): the parameters are usable.
  void wait_unshard() override;
  /// The parameters stay unsharded for backward unless `reshard` (parked meanwhile).
  void end_forward(bool reshard) override;
  /// The conductor unsharded this unit for its backward: wait for it and take gradients. Under
  /// `no_sync` the unsharded gradient is kept (and added to) instead of reduced.
  void begin_backward(bool no_sync) override;
  /// End of backward, on the caller's thread: reduce what is still accumulating (parameters
  /// without gradient), wait for the reduce-scatters, point the gradients at the shards.
  void finish_backward() override;
  bool backward_ran() const override { return backward_ran_; }
  bool is_root() const override { return is_root_; }
  const std::string& name() const override { return name_; }

  /// Forward computed `outputs` from `inputs`: hooks the outputs whose gradient starts this
  /// unit's backward (and, with frozen parameters, the inputs whose gradient ends it). Returns
  /// whether a backward will come.
  bool hook_backward(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);

  /// Autograd has accumulated the gradient of entry `entry` of flat group `flat` (its hook).
  void on_grad_accumulated(size_t flat, size_t entry);
  /// Between steps: reshards the unit if a forward left it unsharded for a backward that has not
  /// started ([Note: resharding between steps]). False if its backward is under way.
  bool reshard_unless_in_backward();
  /// [Note: a parameter rebound from outside] Takes in the parameters that were pointed away
  /// from the unit's buffers; a unit gathered for a backward that has not started is resharded
  /// (its gathered values are out of date). Called at every root forward and between steps.
  void take_in_rebound_params();

  /// [Note: units held unsharded] The backwards held unsharded kept their summed unsharded
  /// gradients (no_sync): reduce them into the gradient shards now, once, and wait. The
  /// parameters stay unsharded (the gradients point at the shard once they are resharded).
  void reduce_kept_gradients();

  /// A unit built by fully_shard_deferred learns its module path once the whole model exists.
  void set_name(const std::string& name);
  /// Sharded when every flat group is; Unsharded when every one is usable; else Unsharding.
  ShardedState sharded_state() const;
  std::vector<FlatGroup>& flats() { return flats_; }
  const std::vector<FlatGroup>& flats() const { return flats_; }

 private:
  // UnitMoments: what this unit does at the moments of its order (order_).
  void issue_gathers() override;
  void wait_gathers() override { wait_unshard(); }
  void allocate_gradients() override;
  void free_params(size_t flat) override;
  void settle_gradient(size_t flat, bool counted) override;

  /// Whether any flat group needs a separate unsharded buffer (FlatParam::needs_unshard).
  bool needs_unshard() const;
  void issue_all_gather(FlatGroup& g);
  void reshard_all();
  void reshard(FlatGroup& g);
  /// Points `g`'s parameters at the shard while its gathered buffer waits for backward.
  void park(FlatGroup& g);
  /// Points them back at the gathered buffer: the backward that was waited for is here.
  void unpark(FlatGroup& g);
  /// Gives the limiter slot back once no flat group is unsharded.
  void release_slot_if_sharded();
  /// Drops the gradient shards whose gradients the optimizer cleared.
  void release_cleared_gradients();
  /// Autograd's hook on an output: the unit's backward is next.
  void pre_backward();
  void post_backward(FlatGroup& g);
  /// The gradient of the unit's inputs is complete: its frozen parameters are done.
  void on_input_grad();
  /// `counted`: the limiter counts the reduction in flight until its task ends.
  void issue_reduce_scatter(FlatGroup& g, bool counted);
  /// How `g`'s gradient is reduced now (dtype, divisors, accumulation).
  ReducePlan reduce_plan(const FlatGroup& g) const;
  bool grads_need_no_reduction(const FlatGroup& g) const;
  /// Where `g`'s gradient goes in this backward.
  GradientPath gradient_path(const FlatGroup& g) const;
  /// Whether `g` is this unit's first flat group (see [Note: a unit's flat parameters]).
  bool is_first(const FlatGroup& g) const { return &g == &flats_.front(); }
  size_t index_of(const FlatGroup& g) const { return static_cast<size_t>(&g - flats_.data()); }
  bool has_frozen_params() const;
  /// Installs the post-hook on the gradient accumulator of entry `entry` of flat group `flat`.
  void hook(size_t flat, size_t entry);

  std::string name_;
  std::string label_;  // name_, or "root": for traces
  std::vector<FlatGroup> flats_;
  UnitEnv env_;
  UnitEvents& events_;
  bool is_root_;
  TracedLimiter limiter_;               // the model's, traced as this unit's
  UnitOrder order_;                     // [Note: one order inside a unit]
  bool no_sync_ = false;                // this backward runs under no_sync
  bool backward_ran_ = false;           // pre_backward ran in this backward pass
  std::chrono::steady_clock::time_point span_start_;  // of the forward or backward traced
};

}  // namespace fsdp
