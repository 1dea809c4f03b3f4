#include "train_step.h"

#include <fsdp/clip.h>
#include <fsdp/fused_adamw.h>

namespace gpt {

namespace {

// The optimizer that steps units during the last backward (--step-in-backward, --cpu-offload):
// the fused AdamW, sharded, and only when nothing needs every gradient before a step (clipping,
// fp16's scaler); else none.
fsdp::optim::AdamW* steps_in_backward(const StepContext& ctx) {
  const TrainOptions& o = ctx.options;
  if (!ctx.sharded() || !(o.step_in_backward || o.fsdp.cpu_offload()) || o.clip > 0 ||
      ctx.precision.loss_scale() > 0) {
    return nullptr;
  }
  return dynamic_cast<fsdp::optim::AdamW*>(&ctx.optimizer);
}

// Backward of one micro-batch's loss; with --no-sync, all but the last keep their unsharded
// gradients, so that the step reduces once, at the end.
void backward(const StepContext& ctx, const torch::Tensor& scaled_loss, bool last_micro_batch) {
  if (ctx.sharded() && ctx.options.no_sync && !last_micro_batch) {
    fsdp::NoSyncGuard no_sync(ctx.model);
    scaled_loss.backward();
  } else if (fsdp::optim::AdamW* optimizer = last_micro_batch ? steps_in_backward(ctx) : nullptr) {
    fsdp::optim::StepInBackward overlap(ctx.model, *optimizer);
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
        micro * ctx.world * o.batch + (ctx.sharded() ? ctx.rank * o.batch : 0);
    const int64_t rows = ctx.sharded() ? o.batch : ctx.world * o.batch;
    auto [inputs, targets] = ctx.corpus.batch(o.seed, step, first_row, rows, o.model.max_seq);
    inputs = inputs.to(ctx.device, /*non_blocking=*/true);
    targets = targets.to(ctx.device, /*non_blocking=*/true);
    ctx.precision.before_forward();
    auto loss = lm_loss(ctx.model(inputs), targets) / static_cast<double>(o.grad_accum);
    backward(ctx, ctx.precision.scale(loss), micro + 1 == o.grad_accum);
    ctx.precision.after_backward();
    loss_sum += loss.detach();
  }
  return loss_sum;
}

void clip_gradients(const StepContext& ctx) {
  if (ctx.sharded()) {
    fsdp::clip_grad_norm_(ctx.model, ctx.options.clip);
  } else {
    torch::nn::utils::clip_grad_norm_(ctx.model->parameters(), ctx.options.clip);
  }
}

}  // namespace

StepResult train_step(const StepContext& ctx, int64_t step) {
  ctx.optimizer.zero_grad();
  StepResult result;
  result.loss = accumulate_gradients(ctx, step);
  if (ctx.options.clip > 0) {
    // Clipping reads unscaled gradients; else the optimizer's kernel divides them as it steps.
    ctx.precision.unscale(ctx.optimizer);
    clip_gradients(ctx);
  }
  result.skipped = !ctx.precision.step(ctx.optimizer);
  return result;
}

}  // namespace gpt
