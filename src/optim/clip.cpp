#include <fsdp/clip.h>

#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

namespace fsdp {
namespace detail {

double clip_grad_norm(FsdpState& state, double max_norm) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  torch::NoGradGuard no_grad;
  const ShardedView model(state);
  std::vector<at::Tensor> grads;
  for (const auto& p : model.params()) {
    if (p.param().grad().defined()) grads.push_back(p.param().grad());
  }
  // Each rank squares only its own pieces (never the padding); replicas hold equal pieces, so
  // the sum runs over the shard group alone.
  // Summed where the collectives run (a GPU's, even when the shards are offloaded to the host).
  const c10::Device device = model.compute_device();
  auto sum_of_squares = at::zeros({1}, at::TensorOptions(at::kDouble).device(device));
  for (const auto& grad : grads) sum_of_squares += grad.to(device, at::kDouble).pow(2).sum();
  model.all_reduce_over_shard_group(sum_of_squares);
  const double norm = std::sqrt(sum_of_squares.item<double>());
  const double scale = max_norm / (norm + 1e-6);  // torch's clip_grad_norm_ formula
  if (scale < 1.0) {
    for (auto& grad : grads) grad.mul_(scale);
  }
  return norm;
}

}  // namespace detail
}  // namespace fsdp
