#include "io/adamw_state.h"

#include <c10/util/Exception.h>

namespace fsdp::detail {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

AdamWParamState* adamw_state(AdamW& optimizer, const at::Tensor& param) {
  auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return nullptr;
  auto* state = dynamic_cast<AdamWParamState*>(it->second.get());
  TORCH_INTERNAL_ASSERT(state, "AdamW holds a state of another optimizer");
  return state;
}

at::Tensor moment(const AdamWParamState& state, const std::string& kind) {
  if (kind == "exp_avg") return state.exp_avg();
  if (kind == "exp_avg_sq") return state.exp_avg_sq();
  return state.max_exp_avg_sq();
}

std::unordered_map<const void*, const AdamWOptions*> options_by_param(AdamW& optimizer) {
  std::unordered_map<const void*, const AdamWOptions*> options;
  for (auto& group : optimizer.param_groups()) {
    const auto* adamw = static_cast<const AdamWOptions*>(&group.options());
    for (auto& p : group.params()) options[p.unsafeGetTensorImpl()] = adamw;
  }
  return options;
}

std::vector<std::string> moments_needed(const AdamWOptions& options) {
  std::vector<std::string> kinds{"exp_avg", "exp_avg_sq"};
  if (options.amsgrad()) kinds.push_back("max_exp_avg_sq");
  return kinds;
}

bool any_amsgrad(AdamW& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    if (static_cast<const AdamWOptions&>(group.options()).amsgrad()) return true;
  }
  return false;
}

}  // namespace fsdp::detail
