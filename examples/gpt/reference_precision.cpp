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

ReferenceLossScaler::ReferenceLossScaler(double init_scale, double growth, double backoff,
                                         int64_t growth_interval)
    : scale_(init_scale), growth_(growth), backoff_(backoff), growth_interval_(growth_interval) {}

torch::Tensor ReferenceLossScaler::scale(const torch::Tensor& loss) const { return loss * scale_; }

void ReferenceLossScaler::unscale_(torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  // torch.amp: the reciprocal of the scale, in fp32, multiplies every gradient.
  const float inverse = static_cast<float>(1.0 / scale_);
  finite_ = true;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      param.mutable_grad().mul_(inverse);
      finite_ = finite_ && torch::isfinite(param.grad()).all().item<bool>();
    }
  }
}

bool ReferenceLossScaler::unscale_step_update(torch::optim::Optimizer& optimizer) {
  unscale_(optimizer);
  return step_update(optimizer);
}

bool ReferenceLossScaler::step_update(torch::optim::Optimizer& optimizer) {
  const bool finite = finite_;
  if (finite) {
    optimizer.step();
    if (++finite_steps_ == growth_interval_) {
      scale_ *= growth_;
      finite_steps_ = 0;
    }
  } else {
    scale_ *= backoff_;
    finite_steps_ = 0;
  }
  return finite;
}

}  // namespace gpt
