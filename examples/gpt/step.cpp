#include "step.h"

#include <fsdp/clip.h>
#include <fsdp/fused_adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <torch/optim/adamw.h>
#include <torch/torch.h>
#include <utility>

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

bool parameters_finite(GPT& gpt, fsdp::Distributed* dist) {
  torch::NoGradGuard no_grad;
  auto bad = torch::zeros({1}, torch::kFloat64);
  for (const auto& p : gpt->parameters()) {
    if (p.numel() == 0) continue;
    // A NaN propagates into the minimum and the maximum, an inf becomes one of them: two values
    // to check instead of a boolean tensor of the parameter's size (1.3 GB at 1.3 B parameters).
    const auto [min, max] = torch::aminmax(p);
    if (!torch::isfinite(torch::stack({min, max})).all().item<bool>()) bad += 1;
  }
  if (dist) fsdp::all_reduce_sum(*dist->world, bad);
  return bad.item<double>() == 0;
}

void NonFiniteGuard::count(double loss, int64_t step) {
  const TrainOptions& o = options_;
  if (std::isfinite(loss)) {
    consecutive_ = 0;
  } else if (++consecutive_ >= o.max_nonfinite_steps) {
    TORCH_CHECK(false, "the loss was ", loss, " for ", consecutive_,
                " consecutive steps (last: step ", step + 1, "); stopping (--max-nonfinite-steps ",
                o.max_nonfinite_steps, "). Lower --lr, set --clip, or check --init-from; no "
                "checkpoint of the non-finite model was saved",
                o.save_every > 0 ? " (the last good one is in --checkpoint-dir)" : "");
  }
}

void NonFiniteGuard::check_finished(GPT& gpt, fsdp::Distributed* dist) const {
  // The parameters' check is a collective; every rank skips it alike (the loss is all-reduced).
  TORCH_CHECK(consecutive_ == 0 && parameters_finite(gpt, dist),
              "training ended with a non-finite ", consecutive_ > 0 ? "loss" : "model",
              " (NaN/inf); not writing ",
              options_.save_full.empty() ? "the model" : options_.save_full,
              ". Lower --lr, set --clip, or check --init-from");
}

namespace {

// The optimizers that step units during the last backward (--step-in-backward, --cpu-offload):
// the fused AdamW (and Muon, with --optimizer muon), sharded, and only when nothing needs every
// gradient before a step (clipping, fp16's scaler); else none.
std::vector<fsdp::optim::StepsInBackward*> steps_in_backward(const StepContext& ctx) {
  const TrainOptions& o = ctx.options;
  if (!ctx.sharded() || !(o.step_in_backward || o.fsdp.cpu_offload()) || o.clip > 0 ||
      ctx.precision.loss_scale() > 0) {
    return {};
  }
  return ctx.optimizers.in_backward();
}

// Backward of one micro-batch's loss; with --no-sync, all but the last keep their unsharded
// gradients, so that the step reduces once, at the end.
void backward(const StepContext& ctx, const torch::Tensor& scaled_loss, bool last_micro_batch) {
  if (ctx.sharded() && ctx.options.no_sync && !last_micro_batch) {
    fsdp::NoSyncGuard no_sync(ctx.model);
    scaled_loss.backward();
  } else if (const auto optimizers = last_micro_batch ? steps_in_backward(ctx)
                                                      : std::vector<fsdp::optim::StepsInBackward*>();
             !optimizers.empty()) {
    fsdp::optim::StepInBackward overlap(ctx.model, optimizers);
    scaled_loss.backward();
  } else {
    scaled_loss.backward();
  }
}

// This rank's mean loss over its rows of the step's micro-batches; their gradients accumulated.
torch::Tensor accumulate_gradients(const StepContext& ctx, int64_t step) {
  const TrainOptions& o = ctx.options;
  auto loss_sum = torch::zeros({}, torch::TensorOptions().device(ctx.device));
  for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
    const int64_t first_row =
        micro * ctx.world * o.batch + (ctx.sharded() ? ctx.data_rank * o.batch : 0);
    const int64_t rows = ctx.sharded() ? o.batch : ctx.world * o.batch;
    auto [inputs, targets] = ctx.corpus.batch(o.seed, step, first_row, rows, o.model.max_seq);
    inputs = inputs.to(ctx.device, /*non_blocking=*/true);
    targets = targets.to(ctx.device, /*non_blocking=*/true);
    ctx.precision.before_forward();
    auto loss = ctx.model->loss(ctx.model(inputs), targets) / static_cast<double>(o.grad_accum);
    backward(ctx, ctx.precision.scale(loss), micro + 1 == o.grad_accum);
    ctx.precision.after_backward();
    loss_sum += loss.detach();
  }
  return loss_sum;
}

// The global norm before clipping (both dimensions under --tp: [Note: the norm over both
// dimensions] in clip.cpp).
double clip_gradients(const StepContext& ctx) {
  if (ctx.sharded()) return fsdp::clip_grad_norm_(ctx.model, ctx.options.clip);
  return torch::nn::utils::clip_grad_norm_(ctx.model->parameters(), ctx.options.clip);
}

// --fault-tolerant: the gradients (and the loss, for the record) averaged over the live replicas.
fsdp::ReplicaStep average_over_replicas(const StepContext& ctx, const torch::Tensor& loss) {
  std::vector<at::Tensor> tensors;
  for (auto& p : ctx.model->parameters()) {
    if (p.grad().defined()) tensors.push_back(p.mutable_grad());
  }
  tensors.push_back(loss);
  return ctx.replicas->average(tensors);
}

}  // namespace

StepResult train_step(const StepContext& ctx, int64_t step) {
  torch::optim::Optimizer& optimizer = ctx.optimizers.stepped();
  optimizer.zero_grad();
  StepResult result;
  result.loss = accumulate_gradients(ctx, step);
  if (ctx.replicas) result.replicas = average_over_replicas(ctx, result.loss);
  if (ctx.options.clip > 0) {
    // Clipping reads unscaled gradients; else the optimizer's kernel divides them as it steps.
    ctx.precision.unscale(optimizer);
    result.grad_norm = clip_gradients(ctx);
  }
  // Host time: on a GPU, what the step queued (the step's own time waits for the device).
  const auto optimizer_start = std::chrono::steady_clock::now();
  result.skipped = !ctx.precision.step(optimizer);
  result.optimizer_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - optimizer_start).count();
  return result;
}

}  // namespace gpt
