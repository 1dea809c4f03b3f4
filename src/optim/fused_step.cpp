#include "optim/fused_step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp::optim::fused {

std::string batch_key(const at::Tensor& param) {
  return param.device().str() + "/" + c10::toString(param.scalar_type());
}

std::optional<at::Tensor> grad_scale(double scale, const at::Tensor& param) {
  if (scale == 0) return std::nullopt;
  return at::full({1}, scale, param.options().dtype(at::kFloat));
}

void check_scale(double scale, const char* optimizer) {
  TORCH_CHECK(scale > 0, optimizer, "::step_scaled: the scale must be positive, got ", scale);
}

void check_state_shape(const at::Tensor& state, const at::Tensor& param, const char* optimizer) {
  TORCH_CHECK(state.sizes() == param.sizes(), optimizer, ": a parameter of shape ", param.sizes(),
              " has optimizer state of shape ", state.sizes(), ": the optimizer stepped or loaded its "
              "state before fully_shard sharded its parameters (each is now this rank's 1-D piece); "
              "build the optimizer after fully_shard (load a checkpoint's state with fsdp::load_sharded)");
}

torch::Tensor loss_of(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace fsdp::optim::fused
