#pragma once
/// Stepping during backward (ZeRO-Offload's overlap): StepInBackward, and StepsInBackward, what an
/// optimizer implements to be stepped that way (fsdp::optim::AdamW and fsdp::optim::SGD do).

#include <fsdp/sharded_model.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fsdp {
class WorkerThread;
class QueuedTask;
}  // namespace fsdp

namespace fsdp::optim {

/// An optimizer that can step some of its parameters while backward goes on: step these
/// parameters with these gradients, now, and skip them in the next step(). The queue that runs
/// those steps on a worker thread, in order, is this class's; an optimizer implements
/// step_parameters (claim_gradients gives it what to step) and, in its step(), waits for the queue
/// (wait_queued_steps), skips what was stepped (stepped_in_backward) and then forgets it
/// (forget_stepped).
class StepsInBackward {
 public:
  StepsInBackward();
  virtual ~StepsInBackward();
  StepsInBackward(const StepsInBackward&) = delete;
  StepsInBackward& operator=(const StepsInBackward&) = delete;

  /// Steps `params` now with `grads` (their gradients, in order), each with its param group's
  /// options; the next step() skips them.
  virtual void step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) = 0;
  /// Queues step_parameters(params, grads) on a worker thread, to run once `ready` returns.
  void step_when_ready(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                       std::function<void()> ready);
  /// Waits for the queued steps; rethrows the first one's failure.
  void wait_queued_steps();

 protected:
  /// The gradient of each of `params` (in order: `grads`) by the parameter's TensorImpl, leaving
  /// out those stepped since the last step(); the others are marked stepped.
  std::unordered_map<const void*, at::Tensor> claim_gradients(const std::vector<at::Tensor>& params,
                                                              const std::vector<at::Tensor>& grads);
  /// Whether step_parameters stepped `param` since the last step().
  bool stepped_in_backward(const at::Tensor& param) const;
  /// step() has stepped the rest: the next backward's steps start afresh.
  void forget_stepped();
  /// For an optimizer's destructor: waits for the queued steps (which call it), ignoring a
  /// failure (step() would have rethrown it).
  void finish_queued_steps() noexcept;

 private:
  std::unordered_set<const void*> stepped_;  // by step_parameters since the last step()
  std::shared_ptr<WorkerThread> worker_;     // runs the queued steps in order (shared_ptr: incomplete here)
  std::shared_ptr<QueuedTask> last_queued_;
};

/// ZeRO-Offload's overlap (Ren et al., 2021): while it lives, each unit's parameters are stepped
/// on `optimizer`'s worker thread as soon as the unit's reduced gradient has landed in its
/// gradient shard, while backward goes on with the units before it. With CPU offload the CPU
/// steps a unit while the GPU computes the next ones. optimizer.step() then waits for those steps
/// and steps what is left (e.g. parameters outside every unit).
///
/// Only around the backward whose gradients are final: the last micro-batch of a step, without
/// gradient clipping or a gradient scaler (both need every gradient before any step). The
/// learning rate must be set before that backward.
///
/// Several optimizers over one model (Muon for the matrices, AdamW for the rest) are each given
/// every unit's gradients and step their own parameters, each on its own worker thread.
///
/// Example:
///   {
///     fsdp::optim::StepInBackward overlap(model, optimizer);  // fsdp::optim::AdamW, SGD, Muon, ...
///     loss.backward();
///   }
///   optimizer.step();
class StepInBackward {
 public:
  StepInBackward(const ShardedModel& model, StepsInBackward& optimizer);
  StepInBackward(const ShardedModel& model, const std::vector<StepsInBackward*>& optimizers);
  ~StepInBackward();
  StepInBackward(const StepInBackward&) = delete;
  StepInBackward& operator=(const StepInBackward&) = delete;

 private:
  ShardedModel model_;
};

}  // namespace fsdp::optim
