#pragma once
// What checkpoints read and write of a torch::optim::AdamW: each parameter's step and moments
// (exp_avg, exp_avg_sq, and max_exp_avg_sq with amsgrad), by the names
// torch.distributed.checkpoint gives them, and the options of the group holding a parameter.

#include <torch/optim/adamw.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp::detail {

/// The kinds of AdamW moments, as tensor_key() names them.
inline constexpr const char* kMomentKinds[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

/// `param`'s AdamW state, or null when the optimizer holds none for it (never stepped).
torch::optim::AdamWParamState* adamw_state(torch::optim::AdamW& optimizer, const at::Tensor& param);

/// The moment of `kind` (one of kMomentKinds); undefined when the state has none.
at::Tensor moment(const torch::optim::AdamWParamState& state, const std::string& kind);

/// The options of the parameter group holding each parameter, by TensorImpl.
std::unordered_map<const void*, const torch::optim::AdamWOptions*> options_by_param(
    torch::optim::AdamW& optimizer);

/// The moments an optimizer with `options` needs (amsgrad adds max_exp_avg_sq).
std::vector<std::string> moments_needed(const torch::optim::AdamWOptions& options);

/// Whether any parameter group uses amsgrad (the same on every rank).
bool any_amsgrad(torch::optim::AdamW& optimizer);

}  // namespace fsdp::detail
