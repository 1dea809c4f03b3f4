#pragma once
// What the fused optimizers (fsdp::optim::AdamW, fsdp::optim::SGD) share around their kernels:
// the batch a parameter joins, the loss scale the kernels divide out, and a step's closure.

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>

namespace fsdp::optim::fused {

/// The kernel call that `param` joins: one per device and dtype.
std::string batch_key(const at::Tensor& param);

/// The gradients' loss scale as the kernels read it, a [1] float beside `param`; none for 0.
std::optional<at::Tensor> grad_scale(double scale, const at::Tensor& param);

/// step_scaled's scale must be positive (`optimizer`: the class that refuses it).
void check_scale(double scale, const char* optimizer);

/// `state` (a parameter's moment or momentum) has `param`'s shape; else throws naming the usual
/// cause: the optimizer stepped, or loaded its state, before fully_shard made the parameter this
/// rank's 1-D piece (ATen's kernel would only say that two sizes differ).
void check_state_shape(const at::Tensor& state, const at::Tensor& param, const char* optimizer);

/// What `closure` returns, run with gradients enabled; undefined without a closure.
torch::Tensor loss_of(const torch::optim::Optimizer::LossClosure& closure);

}  // namespace fsdp::optim::fused
