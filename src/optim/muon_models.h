#pragma once
// Where Muon finds its matrices: each sharded model holding any of its parameters, found once
// when the optimizer is made, and each parameter's record in it ([Note: one placement per
// parameter]).

#include "core/sharded_view.h"

#include <fsdp/tensor_parallel.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace fsdp::optim::muon {

// Where a parameter lies in a sharded model: its record ([Note: one placement per parameter]),
// the flat buffer (unit) holding it, and its place in the model's order.
struct Located {
  detail::ShardedParam param;
  size_t buffer;
  size_t index;
  /// The whole matrix's shape (under tensor parallelism, not this rank's part's).
  std::vector<int64_t> whole_shape() const {
    const auto& placement = param.tensor_parallel();
    return placement ? placement->global_shape : param.shape();
  }
  /// Split over more than one tensor-parallel rank.
  bool split() const {
    const auto& placement = param.tensor_parallel();
    return placement && !placement->replicated() && placement->tp->size() > 1;
  }
};

// The parameters of one sharded model by TensorImpl.
struct ModelParams {
  ShardedModel model;
  detail::ShardedView view;
  std::unordered_map<const void*, Located> by_impl;
};

// The sharded models holding any of `params`, found once, when the optimizer is made.
std::vector<ModelParams> models_of(const std::vector<at::Tensor>& params);

}  // namespace fsdp::optim::muon
