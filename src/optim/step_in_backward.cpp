// Steps in backward (fsdp::optim::StepInBackward): each unit's parameters queued on the
// optimizer's worker thread as its reduction is issued, stepped once the reduced gradient has
// landed.
#include <fsdp/steps_in_backward.h>

#include "core/sharded_view.h"
#include "util/worker_thread.h"

#include <c10/util/Exception.h>

namespace fsdp::optim {

StepsInBackward::StepsInBackward() = default;
StepsInBackward::~StepsInBackward() = default;

void StepsInBackward::step_when_ready(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                                      std::function<void()> ready) {
  if (!worker_) worker_ = std::make_shared<WorkerThread>();
  last_queued_ = worker_->submit(
      [this, params = std::move(params), grads = std::move(grads), ready = std::move(ready)] {
        ready();
        step_parameters(params, grads);
      });
}

void StepsInBackward::wait_queued_steps() {
  if (!last_queued_) return;
  const std::shared_ptr<QueuedTask> last = std::move(last_queued_);
  last->wait();  // in order: the last one's end is every one's; a failure fails every later one
}

void StepsInBackward::finish_queued_steps() noexcept {
  try {
    wait_queued_steps();
  } catch (const std::exception&) {  // a destructor does not throw; step() would have
  }
}

std::unordered_map<const void*, at::Tensor> StepsInBackward::claim_gradients(
    const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  TORCH_CHECK(params.size() == grads.size(), "step_parameters: ", params.size(), " parameters but ",
              grads.size(), " gradients");
  std::unordered_map<const void*, at::Tensor> grad_of;
  for (size_t i = 0; i < params.size(); ++i) {
    if (stepped_.insert(params[i].unsafeGetTensorImpl()).second) {
      grad_of.emplace(params[i].unsafeGetTensorImpl(), grads[i]);
    }
  }
  return grad_of;
}

bool StepsInBackward::stepped_in_backward(const at::Tensor& param) const {
  return stepped_.count(param.unsafeGetTensorImpl()) > 0;
}

void StepsInBackward::forget_stepped() { stepped_.clear(); }

StepInBackward::StepInBackward(const ShardedModel& model, StepsInBackward& optimizer)
    : StepInBackward(model, std::vector<StepsInBackward*>{&optimizer}) {}

StepInBackward::StepInBackward(const ShardedModel& model, const std::vector<StepsInBackward*>& optimizers)
    : model_(model) {
  for (size_t i = 0; i < optimizers.size(); ++i) {
    TORCH_CHECK(optimizers[i], "StepInBackward: optimizer #", i, " is null");
  }
  detail::ShardedView(model_).set_gradients_reduced_hook(
      [optimizers](std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::function<void()> wait) {
        for (StepsInBackward* optimizer : optimizers) optimizer->step_when_ready(params, grads, wait);
      });
}

StepInBackward::~StepInBackward() { detail::ShardedView(model_).set_gradients_reduced_hook(nullptr); }

}  // namespace fsdp::optim
