#pragma once
// One FSDP unit at run time: its flat parameter, its state machine, and the four moments of the
// paper's section 3.3: unshard before forward, reshard after, unshard before backward, reduce
// the gradient and reshard as soon as backward has produced it.

#include "collectives.h"
#include "flat_param.h"

#include <fsdp/fully_shard.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdp {

/// Where the unit's parameters live.
enum class ShardedState {
  Sharded,    ///< only this rank's shard; parameters are views of it
  Unsharded,  ///< the full buffer is gathered; parameters are views of it in their shapes
};

/// Where the unit is in the current backward pass.
enum class BackwardState {
  Idle,         ///< no backward under way for this unit
  Accumulating, ///< unsharded for backward; autograd is adding gradients into the full buffer
  Reduced,      ///< gradient reduce-scattered into the shard, full buffers freed
};

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  ParamGroup(std::string name, FlatParam flat, Collectives& collectives, FsdpState& state,
             bool is_root);

  /// Called once after construction: installs the gradient hooks (needs shared_from_this).
  void install_grad_hooks();

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);
  /// First gradient reached one of this unit's outputs: its backward is next.
  void pre_backward();
  /// Autograd has accumulated one more of this unit's parameter gradients.
  void on_grad_accumulated();
  /// End of backward: reduce whatever is still accumulating (parameters without gradient) and
  /// leave the unit sharded.
  void finish_backward();

  UnitInfo info() const;
  ShardedState sharded_state() const { return sharded_state_; }
  bool is_root() const { return is_root_; }
  FlatParam& flat() { return flat_; }

 private:
  void unshard();
  void reshard();
  void reduce_grad();

  std::string name_;
  FlatParam flat_;
  Collectives& collectives_;
  FsdpState& state_;
  bool is_root_;
  ShardedState sharded_state_ = ShardedState::Sharded;
  BackwardState backward_state_ = BackwardState::Idle;
  int grads_pending_ = 0;           // trainable parameters whose gradient has not arrived yet
  bool accumulate_into_shard_ = false;  // the optimizer kept the previous gradient: add to it
};

}  // namespace fsdp
