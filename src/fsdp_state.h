#pragma once
// The state of one sharded model: its units (root first), the collectives they share, and the
// end-of-backward callback that the root queues on the autograd engine.

#include "collectives.h"
#include "param_group.h"

#include <memory>
#include <vector>

namespace fsdp {

class FsdpState {
 public:
  FsdpState(ProcessGroup& group, FullyShardOptions options);

  Collectives& collectives() { return *collectives_; }
  const FullyShardOptions& options() const { return options_; }
  std::vector<std::shared_ptr<ParamGroup>>& groups() { return groups_; }
  const std::vector<std::shared_ptr<ParamGroup>>& groups() const { return groups_; }

  /// Called from the root's pre-backward hook: queue finish_backward() on the autograd engine.
  void queue_finish_backward();

 private:
  void finish_backward();

  std::unique_ptr<Collectives> collectives_;
  FullyShardOptions options_;
  std::vector<std::shared_ptr<ParamGroup>> groups_;  // groups_[0] is the root unit
  bool finish_queued_ = false;
};

}  // namespace fsdp
