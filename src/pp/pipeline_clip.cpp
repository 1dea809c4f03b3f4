// clip_grad_norm_ over a pipeline's stages ([Note: the norm over every stage]).
#include <fsdp/pipeline.h>

#include "optim/gradient_squares.h"

#include <fsdp/distributed.h>
#include <fsdp/parallelize.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

namespace fsdp::pp {
namespace {

// [Note: the norm over every stage]
// The unsplit model's gradient norm counts each element once. A stage's elements are on the pp
// rank running it: the squares are summed over the stages of this rank, then over the pp group.
// A sharded stage's squares come summed over its dp (and tp) ranks already, as
// fsdp::clip_grad_norm_ sums them; an unsharded stage's are its whole gradients. A weight tied
// across stages has, after the step, the same summed gradient on every stage holding it: only its
// first holding stage counts it (on one rank, two stages holding it hold one tensor, counted and
// scaled once; a sharded stage leaves the pieces of a tie it does not count out of its squares).
bool counted_by_another_stage(const Stage& stage, const std::string& name) {
  for (const TiedParameter& tie : stage.tied_parameters()) {
    if (tie.name == name) return tie.stages.front() != stage.index();
  }
  return false;
}

// The stage's names of the tied weights another stage counts: a sharded stage's pieces are its own
// copy's, summed over its shard group.
std::set<std::string> counted_by_other_stages(const Stage& stage) {
  std::set<std::string> out;
  for (const TiedParameter& tie : stage.tied_parameters()) {
    if (tie.stages.front() != stage.index()) out.insert(tie.name);
  }
  return out;
}

// An unsharded stage's gradient is counted whole; a part split over tensor-parallel ranks is not
// the whole, and only the model's record (a sharded stage's) knows which ranks hold the rest.
void check_not_split(const at::Tensor& param, const std::string& name) {
  const auto placement = tp::placement_of(param);
  TORCH_CHECK(!placement || placement->replicated() || placement->tp->size() == 1,
              "fsdp::pp::clip_grad_norm_: '", name, "' is split over ", placement ? placement->tp->size() : 0,
              " tensor-parallel ranks in a stage fully_shard has not sharded, so its norm would count this "
              "rank's part alone; shard the stage (Stage::fully_shard over its dp group: a group of one "
              "rank will do) before clipping");
}

}  // namespace

double clip_grad_norm_(Pipeline& pipeline, double max_norm) {
  TORCH_CHECK(max_norm > 0, "fsdp::pp::clip_grad_norm_: max_norm must be positive, got ", max_norm);
  torch::NoGradGuard no_grad;
  at::Tensor squares = at::zeros({1}, at::kDouble);
  std::vector<at::Tensor> grads;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (Stage& stage : pipeline.stages()) {
    if (stage.is_sharded()) {
      detail::GradientSquares sharded = detail::gradient_squares(stage.sharded_model(), counted_by_other_stages(stage));
      squares += sharded.squares.cpu();
      grads.insert(grads.end(), sharded.grads.begin(), sharded.grads.end());
      continue;
    }
    for (const auto& item : stage.named_parameters()) {
      const at::Tensor grad = item.value().grad();
      if (!grad.defined() || !seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
      check_not_split(item.value(), item.key());
      grads.push_back(grad);
      if (counted_by_another_stage(stage, item.key())) continue;
      const at::Tensor wide = grad.element_size() < 4 ? grad.to(at::kFloat) : grad;
      squares += at::linalg_vector_norm(wide, 2).to(at::kCPU, at::kDouble).square();
    }
  }
  if (pipeline.group().size() > 1) all_reduce_sum(pipeline.group(), squares);
  return detail::scale_to_norm(grads, std::sqrt(squares.item<double>()), max_norm);
}

}  // namespace fsdp::pp
