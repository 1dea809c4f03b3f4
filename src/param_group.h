#pragma once
// One FSDP unit at run time: its flat parameter, its state machine, and the moments of the
// paper's section 3.3: unshard before forward, reshard after, unshard before backward, reduce
// the gradient and reshard as soon as backward has produced it. Communication is submitted to the
// model's Device ([Note: the device seam]); prefetch decisions belong to FsdpState.

#include "comm_thread.h"
#include "flat_param.h"
#include "unit_comm.h"

#include <fsdp/fully_shard.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

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
  ParamGroup(std::string name, FlatParam flat, FsdpState& state, bool is_root);

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

  void pre_forward();
  /// `inputs`: the unit's input tensors; a unit without trainable parameters learns from their
  /// gradients that its backward is over.
  void post_forward(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);
  /// First gradient reached one of this unit's outputs: its backward is next.
  void pre_backward();
  /// Autograd has accumulated the gradient of the flat parameter's entry `entry`.
  void on_grad_accumulated(size_t entry);
  /// End of backward, on the caller's thread: reduce what is still accumulating (parameters
  /// without gradient), wait for the reduce-scatter, point the gradients at the shard.
  void finish_backward();

  /// Issues the all-gather if the unit is sharded (a prefetch passes `optional`: the rate
  /// limiter may refuse it). Returns false if refused.
  bool issue_unshard(bool optional);

  const std::string& name() const { return name_; }
  /// A unit built by fully_shard_deferred learns its module path once the whole model exists.
  void set_name(const std::string& name);
  UnitInfo info() const;
  ShardedState sharded_state() const { return sharded_state_; }
  /// Whether this unit's backward has started in the current backward pass.
  bool backward_ran() const { return backward_ran_; }
  bool is_root() const { return is_root_; }
  /// Counted by the rate limiter (slots and reductions): every unit but the root and parts.
  bool rate_limited() const { return !is_root_ && !is_part_; }
  FlatParam& flat() { return flat_; }
  const FsdpState& state() const { return state_; }

 private:
  void wait_unshard();
  void reshard(bool with_parts = true);
  /// Allocates (or keeps, under no_sync) the unsharded gradient and waits for autograd's.
  void begin_accumulating();
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
  FsdpState& state_;
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
  bool holds_limiter_slot_ = false;     // counted by the rate limiter (not the root)
  bool backward_ran_ = false;           // pre_backward ran in this backward pass
  std::chrono::steady_clock::time_point span_start_;  // of the forward or backward being traced
};

}  // namespace fsdp
