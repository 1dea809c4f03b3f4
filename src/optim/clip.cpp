#include <fsdp/clip.h>

#include "core/sharded_view.h"
#include "core/stage_marks.h"
#include "optim/gradient_squares.h"

#include <fsdp/parallelize.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
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

// [Note: the norm over both dimensions]
// Under tensor parallelism a parameter is split over the tp ranks (each holds a different part)
// or replicated (a norm's weight: each holds all of it, and after backward the same gradient).
// Each element must count once: a split parameter's squares are summed over the tp ranks, a
// replicated one's are taken from the group's first rank only. Then, as without it, the pieces
// FSDP sharded are summed over the shard group (replicas hold equal pieces).
struct NormTerms {
  std::vector<at::Tensor> counted;  // the gradients this rank's squares count
  std::shared_ptr<tp::TensorParallel> tp;  // the group split parameters are summed over, if any
};

// `placements[i]`: how the parameter of `grads[i]` is split over tensor-parallel ranks, if at all.
NormTerms norm_terms(const std::vector<at::Tensor>& grads, const std::vector<std::optional<tp::Placement>>& placements) {
  NormTerms terms;
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& placement = placements[i];
    if (placement) {
      TORCH_CHECK(!terms.tp || &terms.tp->group() == &placement->tp->group(),
                  "clip_grad_norm_: the parameters belong to two tensor-parallel groups; clip each model's on its own");
      terms.tp = placement->tp;
      if (placement->replicated() && placement->tp->rank() != 0) continue;
    }
    terms.counted.push_back(grads[i]);
  }
  return terms;
}

// The squares' sum over the tensor-parallel group, when there is one.
void sum_over_tensor_parallel(const NormTerms& terms, at::Tensor& squares) {
  if (terms.tp && terms.tp->size() > 1) all_reduce_sum(terms.tp->group(), squares);
}

// [Note: calls that see one stage] (core/stage_marks.cpp).
void check_not_a_stage(const at::Tensor& param) {
  const auto mark = detail::stage_mark_of(param);
  TORCH_CHECK(!mark, "fsdp::clip_grad_norm_: '", mark ? mark->name : "", "' is a parameter of ",
              mark ? mark->stage : "", " of a pipeline, so this norm would count this pp rank's stages alone and "
              "clip each rank by its own norm; call fsdp::pp::clip_grad_norm_(pipeline, max_norm), which sums "
              "the norm over every stage");
}

}  // namespace

namespace detail {

GradientSquares gradient_squares(const ShardedModel& sharded, const std::set<std::string>& counted_elsewhere) {
  const ShardedView model(sharded);
  std::vector<at::Tensor> grads, counted;
  std::vector<std::optional<tp::Placement>> placements;
  for (const auto& p : model.params()) {
    if (!p.param().grad().defined()) continue;
    grads.push_back(p.param().grad());
    if (counted_elsewhere.count(p.name()) != 0) continue;
    counted.push_back(p.param().grad());
    placements.push_back(p.tensor_parallel());
  }
  // Each rank squares only its own pieces (never the padding); replicas hold equal pieces, so
  // the sum runs over the shard group alone ([Note: the norm over both dimensions]).
  // Summed where the collectives run (a GPU's, even when the shards are offloaded to the host).
  const NormTerms terms = norm_terms(counted, placements);
  at::Tensor squares = sum_of_squares(terms.counted, model.compute_device());
  model.all_reduce_over_shard_group(squares);
  sum_over_tensor_parallel(terms, squares);
  return {squares, std::move(grads)};
}

double scale_to_norm(const std::vector<at::Tensor>& grads, double norm, double max_norm) {
  const double scale = max_norm / (norm + 1e-6);  // torch's clip_grad_norm_ formula
  if (scale < 1.0) {
    for (const auto& grad : grads) grad.mul_(scale);
  }
  return norm;
}

}  // namespace detail

double clip_grad_norm_(const ShardedModel& sharded, double max_norm) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  torch::NoGradGuard no_grad;
  for (const auto& p : detail::ShardedView(sharded).params()) check_not_a_stage(p.param());
  const detail::GradientSquares model = detail::gradient_squares(sharded);
  return detail::scale_to_norm(model.grads, std::sqrt(model.squares.item<double>()), max_norm);
}

namespace {

// The tensor-parallel placement of each parameter of `models`, by the parameter.
std::unordered_map<const c10::TensorImpl*, std::optional<tp::Placement>> placements_in(
    const std::vector<ShardedModel>& models) {
  std::unordered_map<const c10::TensorImpl*, std::optional<tp::Placement>> found;
  for (const auto& model : models) {
    for (const auto& p : detail::ShardedView(model).params()) found.emplace(p.param().unsafeGetTensorImpl(), p.tensor_parallel());
  }
  return found;
}

}  // namespace

double clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  TORCH_CHECK(norm_type == 2.0, "fsdp::clip_grad_norm_: only the L2 norm (norm_type 2) is summed "
              "across shards, got norm_type ", norm_type);
  torch::NoGradGuard no_grad;
  for (const auto& param : parameters) check_not_a_stage(param);
  const std::vector<ShardedModel> models = detail::models_holding(parameters);
  TORCH_CHECK(models.size() <= 1, "fsdp::clip_grad_norm_: the parameters belong to ", models.size(),
              " sharded models; clip each model's parameters in a call of its own");
  const auto found = placements_in(models);
  std::vector<at::Tensor> pieces, wholes;
  std::vector<std::optional<tp::Placement>> piece_placements, whole_placements;
  for (const auto& param : parameters) {
    if (!param.grad().defined()) continue;
    const auto it = found.find(param.unsafeGetTensorImpl());
    if (it != found.end()) {
      pieces.push_back(param.grad());
      piece_placements.push_back(it->second);
    } else {
      wholes.push_back(param.grad());
      whole_placements.push_back(tp::placement_of(param));  // a tensor-parallel model FSDP did not shard
    }
  }
  const NormTerms piece_terms = norm_terms(pieces, piece_placements);
  const NormTerms whole_terms = norm_terms(wholes, whole_placements);
  auto squares = at::zeros({1}, at::kDouble);
  if (!models.empty()) {
    const detail::ShardedView model(models.front());
    at::Tensor sum = sum_of_squares(piece_terms.counted, model.compute_device());
    model.all_reduce_over_shard_group(sum);
    squares += sum.cpu();
  }
  if (!whole_terms.counted.empty()) {
    squares += sum_of_squares(whole_terms.counted, whole_terms.counted.front().device()).cpu();
  }
  // Every rank of a tensor-parallel group calls with the same list: one of the two names it.
  sum_over_tensor_parallel(piece_terms.tp ? piece_terms : whole_terms, squares);
  pieces.insert(pieces.end(), wholes.begin(), wholes.end());
  return detail::scale_to_norm(pieces, std::sqrt(squares.item<double>()), max_norm);
}

}  // namespace fsdp
