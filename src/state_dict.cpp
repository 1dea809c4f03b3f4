#include <fsdp/state_dict.h>

#include "fsdp_state.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp {
namespace detail {

std::vector<std::pair<std::string, at::Tensor>> gather_full_params(FsdpState& state) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
    at::Tensor full = at::empty({flat.padded_numel()}, flat.shard().options());
    state.collectives().all_gather(full, flat.shard());
    for (const auto& e : flat.entries()) {
      params.emplace_back(e.name, full.narrow(0, e.offset, e.numel).view(e.shape).clone());
    }
  }
  return params;
}

}  // namespace detail
}  // namespace fsdp
