#include "reference_precision.h"

#include <torch/torch.h>

namespace gpt {

ReferencePrecision::ReferencePrecision(torch::nn::Module& model, const fsdp::MixedPrecision& policy)
    : params_(model.parameters()), policy_(policy) {}

void ReferencePrecision::cast_parameters() {
  torch::NoGradGuard no_grad;
  masters_.clear();
  master_grads_.clear();
  for (auto& param : params_) {
    masters_.push_back(param.data());
    master_grads_.push_back(param.grad());
    param.mutable_grad() = torch::Tensor();
    if (auto dtype = policy_.param_dtype()) param.set_data(param.data().to(*dtype));
  }
}

void ReferencePrecision::restore_masters() {
  torch::NoGradGuard no_grad;
  const auto reduce_dtype = policy_.reduce_dtype() ? policy_.reduce_dtype() : policy_.param_dtype();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& param = params_[i];
    torch::Tensor grad = param.grad();
    param.set_data(masters_[i]);
    if (grad.defined()) {
      if (reduce_dtype) grad = grad.to(*reduce_dtype);
      grad = grad.to(masters_[i].scalar_type());
      if (master_grads_[i].defined()) grad = master_grads_[i] + grad;
    } else {
      grad = master_grads_[i];
    }
    param.mutable_grad() = grad;
  }
}

}  // namespace gpt
