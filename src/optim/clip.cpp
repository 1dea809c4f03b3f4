#include <fsdp/clip.h>

#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <memory>
#include <unordered_set>
#include <utility>
#include <vector>

namespace fsdp {
namespace {

// The sum of the gradients' squares, in double, on `device`. Each gradient's norm is taken where
// it lies, in fp32 or wider, as torch::nn::utils::clip_grad_norm_ takes it: a double copy of
// each gradient and of its squares (two fresh buffers of twice its bytes, every step) cost more
// than the norm itself.
at::Tensor sum_of_squares(const std::vector<at::Tensor>& grads, c10::Device device) {
  auto sum = at::zeros({1}, at::TensorOptions(at::kDouble).device(device));
  for (const auto& grad : grads) {
    const at::Tensor wide = grad.element_size() < 4 ? grad.to(at::kFloat) : grad;
    sum += at::linalg_vector_norm(wide, 2).to(device, at::kDouble).square();
  }
  return sum;
}

}  // namespace

double clip_grad_norm_(const ShardedModel& sharded, double max_norm) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  torch::NoGradGuard no_grad;
  const detail::ShardedView model(sharded);
  std::vector<at::Tensor> grads;
  for (const auto& p : model.params()) {
    if (p.param().grad().defined()) grads.push_back(p.param().grad());
  }
  // Each rank squares only its own pieces (never the padding); replicas hold equal pieces, so
  // the sum runs over the shard group alone.
  // Summed where the collectives run (a GPU's, even when the shards are offloaded to the host).
  const c10::Device device = model.compute_device();
  at::Tensor squares = sum_of_squares(grads, device);
  model.all_reduce_over_shard_group(squares);
  const double norm = std::sqrt(squares.item<double>());
  const double scale = max_norm / (norm + 1e-6);  // torch's clip_grad_norm_ formula
  if (scale < 1.0) {
    for (auto& grad : grads) grad.mul_(scale);
  }
  return norm;
}

namespace {

// The sharded model `param` belongs to, among `models`; null if none.
const ShardedModel* model_of(const at::Tensor& param,
                             const std::vector<std::pair<ShardedModel, std::unordered_set<const c10::TensorImpl*>>>& models) {
  for (const auto& [model, params] : models) {
    if (params.count(param.unsafeGetTensorImpl())) return &model;
  }
  return nullptr;
}


}  // namespace

double clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  TORCH_CHECK(norm_type == 2.0, "fsdp::clip_grad_norm_: only the L2 norm (norm_type 2) is summed "
              "across shards, got norm_type ", norm_type);
  torch::NoGradGuard no_grad;
  std::vector<std::pair<ShardedModel, std::unordered_set<const c10::TensorImpl*>>> models;
  for (auto& model : detail::sharded_models()) {
    std::unordered_set<const c10::TensorImpl*> params;
    for (const auto& p : detail::ShardedView(model).params()) params.insert(p.param().unsafeGetTensorImpl());
    models.emplace_back(std::move(model), std::move(params));
  }
  const ShardedModel* sharded = nullptr;  // the one model the sharded parameters belong to
  std::vector<at::Tensor> pieces, wholes;
  for (size_t i = 0; i < parameters.size(); ++i) {
    auto owner = model_of(parameters[i], models);
    TORCH_CHECK(!owner || !sharded || *owner == *sharded, "fsdp::clip_grad_norm_: parameter #", i,
                " belongs to another sharded model than the ones before it; clip each model's "
                "parameters in a call of its own");
    if (owner) sharded = owner;
    if (!parameters[i].grad().defined()) continue;
    (owner ? pieces : wholes).push_back(parameters[i].grad());
  }
  double squares = 0.0;
  if (sharded) {
    const detail::ShardedView model(*sharded);
    at::Tensor sum = sum_of_squares(pieces, model.compute_device());
    model.all_reduce_over_shard_group(sum);
    squares += sum.item<double>();
  }
  if (!wholes.empty()) squares += sum_of_squares(wholes, wholes.front().device()).item<double>();
  const double norm = std::sqrt(squares);
  const double scale = max_norm / (norm + 1e-6);  // torch's clip_grad_norm_ formula
  if (scale < 1.0) {
    for (auto& grad : pieces) grad.mul_(scale);
    for (auto& grad : wholes) grad.mul_(scale);
  }
  return norm;
}

}  // namespace fsdp
