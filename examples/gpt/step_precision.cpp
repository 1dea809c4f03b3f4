#include "step_precision.h"

#include <utility>

namespace gpt {

StepPrecision::StepPrecision(const TrainOptions& o, fsdp::Distributed* dist, GPT& model) {
  const auto& policy = o.fsdp.mixed_precision();
  if (policy.param_dtype() == torch::kHalf) {
    if (dist) {
      scaler_ = std::make_unique<fsdp::ShardedGradScaler>(
          *dist->world, fsdp::GradScalerOptions().init_scale(o.loss_scale));
    } else {
      reference_scaler_ = std::make_unique<ReferenceLossScaler>(o.loss_scale);
    }
  }
  if (!dist && (policy.param_dtype() || policy.reduce_dtype())) {
    reference_precision_ = std::make_unique<ReferencePrecision>(*model, policy);
  }
}

void StepPrecision::before_forward() {
  if (reference_precision_) reference_precision_->cast_parameters();
}

void StepPrecision::after_backward() {
  if (reference_precision_) reference_precision_->restore_masters();
}

torch::Tensor StepPrecision::scale(const torch::Tensor& loss) const {
  if (scaler_) return scaler_->scale(loss);
  if (reference_scaler_) return reference_scaler_->scale(loss);
  return loss;
}

void StepPrecision::unscale(torch::optim::Optimizer& optimizer) {
  if (scaler_) scaler_->unscale_(optimizer);
  if (reference_scaler_) reference_scaler_->unscale_(optimizer);
  unscaled_ = true;
}

bool StepPrecision::step(torch::optim::Optimizer& optimizer) {
  if (scaler_) {
    const bool stepped = scaler_->step(optimizer);
    scaler_->update();
    return stepped;
  }
  if (reference_scaler_) {
    const bool unscaled = std::exchange(unscaled_, false);
    return unscaled ? reference_scaler_->step_update(optimizer)
                    : reference_scaler_->unscale_step_update(optimizer);
  }
  optimizer.step();
  return true;
}

double StepPrecision::loss_scale() const {
  if (scaler_) return scaler_->get_scale();
  if (reference_scaler_) return reference_scaler_->current_scale();
  return 0;
}

}  // namespace gpt
