#include <fsdp/grad_scaler.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <string>
#include <vector>

namespace fsdp {

ShardedGradScaler::ShardedGradScaler(ProcessGroup& group, GradScalerOptions options)
    : ShardedGradScaler(options) {
  group_ = &group;
}

ShardedGradScaler::ShardedGradScaler(GradScalerOptions options)
    : group_(nullptr), options_(options), scale_(options.init_scale()) {
  TORCH_CHECK(options.init_scale() > 0 && options.growth_factor() > 1 &&
                  options.backoff_factor() > 0 && options.backoff_factor() < 1 &&
                  options.growth_interval() >= 1,
              "GradScalerOptions: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 "
              "and growth_interval >= 1; got ", options.init_scale(), ", ", options.growth_factor(),
              ", ", options.backoff_factor(), ", ", options.growth_interval());
}

at::Tensor ShardedGradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

void ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(!checked_, "ShardedGradScaler::unscale_ was already called this step; call "
              "update() after step() to start the next one");
  check_gradients(optimizer, /*unscale=*/true);
}

namespace {

// 1 if one of `grads` (one device and dtype) holds inf or NaN, else 0, as a [1] float on their
// device; it only reads them. Their L2 norms, summed in fp32, are inf or NaN exactly then, short
// of a finite fp32 gradient above ~1e19, whose square overflows: counted as an overflow, which
// backs the scale off. (fp16 gradients, the reason for a scaler, stop at 65504 before their cast.)
at::Tensor non_finite(const std::vector<at::Tensor>& grads) {
  const auto norms = at::_foreach_norm(grads, 2, at::kFloat);
  return at::stack(norms).sum().isfinite().logical_not().to(at::kFloat).reshape({1});
}

}  // namespace

void ShardedGradScaler::check_gradients(torch::optim::Optimizer& optimizer, bool unscale) {
  torch::NoGradGuard no_grad;
  // One fused pass per device and dtype, no host sync per gradient: with `unscale`, ATen's kernel
  // behind torch.amp.GradScaler, which divides by the scale and notes a non-finite value.
  std::map<std::string, std::vector<at::Tensor>> grads;
  for (auto& param_group : optimizer.param_groups()) {
    for (auto& param : param_group.params()) {
      const at::Tensor& grad = param.grad();
      if (grad.defined()) grads[grad.device().str() + c10::toString(grad.scalar_type())].push_back(grad);
    }
  }
  auto overflowed = at::zeros({1});
  for (auto& [key, same] : grads) {
    at::Tensor found_inf;
    if (unscale) {
      const auto options = same.front().options().dtype(at::kFloat);
      found_inf = at::zeros({1}, options);
      at::_amp_foreach_non_finite_check_and_unscale_(same, found_inf, at::full({1}, 1.0 / scale_, options));
    } else {
      found_inf = non_finite(same);
    }
    overflowed += found_inf.cpu();
  }
  // Every rank sees only its shard: agree, or some ranks would step and others not.
  if (group_) all_reduce_sum(*group_, overflowed);
  found_inf_ = overflowed.item<float>() > 0;
  checked_ = true;
  unscaled_ = unscale;
}

bool ShardedGradScaler::step(torch::optim::Optimizer& optimizer) {
  auto* divides_itself = dynamic_cast<StepsScaledGradients*>(&optimizer);
  if (!checked_) check_gradients(optimizer, /*unscale=*/divides_itself == nullptr);
  if (found_inf_) return false;
  if (unscaled_) {
    optimizer.step();
  } else {
    divides_itself->step_scaled(scale_);
    unscaled_ = true;  // the update left them divided
  }
  return true;
}

void ShardedGradScaler::update() {
  TORCH_CHECK(checked_, "ShardedGradScaler::update: call step() (or unscale_()) first");
  if (found_inf_) {
    scale_ *= options_.backoff_factor();
    good_steps_ = 0;
  } else if (++good_steps_ == options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    good_steps_ = 0;
  }
  checked_ = false;
  unscaled_ = false;
}

}  // namespace fsdp
