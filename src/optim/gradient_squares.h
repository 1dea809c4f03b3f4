#pragma once
// The two halves of clip_grad_norm_, for a caller that sums the squares over more than one
// sharded model (a pipeline's stages: src/pp/pipeline_clip.cpp) before it scales.

#include <fsdp/sharded_model.h>

#include <ATen/core/Tensor.h>

#include <set>
#include <string>
#include <vector>

namespace fsdp::detail {

struct GradientSquares {
  at::Tensor squares;              // double, one element: summed over the shard and tp groups
  std::vector<at::Tensor> grads;   // the gradients it counted, to scale
};

/// The sum of the squares of a sharded model's gradients, each element once ([Note: the norm
/// over both dimensions] in src/optim/clip.cpp): a collective over its shard group (and tp group).
/// The parameters named in `counted_elsewhere` (a pipeline's tied weight, which another stage
/// counts) are scaled but not counted.
GradientSquares gradient_squares(const ShardedModel& model, const std::set<std::string>& counted_elsewhere = {});

/// Scales `grads` so that a norm of `norm` becomes at most `max_norm` (torch's formula);
/// returns `norm`.
double scale_to_norm(const std::vector<at::Tensor>& grads, double norm, double max_norm);

}  // namespace fsdp::detail
