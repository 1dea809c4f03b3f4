// Steps in backward (fsdp::optim::StepInBackward): each unit's parameters queued on AdamW's worker
// thread as its reduction is issued, stepped once the reduced gradient has landed.
#include <fsdp/fused_adamw.h>

#include "util/worker_thread.h"

#include <c10/util/Exception.h>

namespace fsdp::optim {

void AdamW::step_when_ready(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                            std::function<void()> ready) {
  if (!worker_) worker_ = std::make_shared<WorkerThread>();
  last_queued_ = worker_->submit(
      [this, params = std::move(params), grads = std::move(grads), ready = std::move(ready)] {
        ready();
        step_parameters(params, grads);
      });
}

void AdamW::wait_queued_steps() {
  if (!last_queued_) return;
  const std::shared_ptr<QueuedTask> last = std::move(last_queued_);
  last->wait();  // in order: the last one's end is every one's; a failure fails every later one
}

StepInBackward::StepInBackward(std::shared_ptr<FsdpState> state, AdamW& optimizer) : state_(std::move(state)) {
  TORCH_CHECK(state_, "StepInBackward: the model is not sharded (call fully_shard)");
  detail::set_gradients_reduced_hook(
      *state_, [&optimizer](std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                            std::function<void()> wait) {
        optimizer.step_when_ready(std::move(params), std::move(grads), std::move(wait));
      });
}

StepInBackward::~StepInBackward() { detail::set_gradients_reduced_hook(*state_, nullptr); }

}  // namespace fsdp::optim
