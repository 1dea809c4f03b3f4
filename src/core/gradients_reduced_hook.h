#pragma once
// What the model calls as each unit's reduced gradient is issued (fsdp::optim::StepInBackward
// sets it through core/sharded_view.h).

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace fsdp::detail {

/// Called for each unit as its reduced gradient is issued: its trainable parameters, their
/// gradients (views of its gradient shard) and a wait that returns once those hold this
/// backward's gradient in memory the host may read.
using GradientsReducedHook = std::function<void(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                                                std::function<void()> wait)>;

}  // namespace fsdp::detail
