#pragma once
/// The model's state across shards: gathering the full parameters.

#include <fsdp/fully_shard.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp {

namespace detail {
std::vector<std::pair<std::string, at::Tensor>> gather_full_params(FsdpState& state);
}

/// Every parameter of a sharded model, unsharded, with its original name and shape, on every
/// rank (a collective: all ranks must call it). Copies: changing them does not touch the model.
///
/// Example:
///   for (auto& [name, tensor] : fsdp::gather_full_params(model)) std::cout << name << "\n";
template <class M>
std::vector<std::pair<std::string, at::Tensor>> gather_full_params(Unit<M>& root) {
  TORCH_CHECK(root.slot().state, "gather_full_params: the model is not sharded (call fully_shard)");
  return detail::gather_full_params(*root.slot().state);
}

}  // namespace fsdp
