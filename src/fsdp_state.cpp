#include "fsdp_state.h"

#include <torch/csrc/autograd/engine.h>

namespace fsdp {

FsdpState::FsdpState(ProcessGroup& group, FullyShardOptions options)
    : collectives_(make_ring_collectives(group)), options_(std::move(options)) {}

void FsdpState::queue_finish_backward() {
  if (finish_queued_) return;
  finish_queued_ = true;
  // Queued from the root's pre-backward hook, i.e. from the outer backward: a callback queued
  // inside a nested backward (activation recomputation) would run when that one ends.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void FsdpState::finish_backward() {
  finish_queued_ = false;
  for (auto& group : groups_) group->finish_backward();
}

}  // namespace fsdp
