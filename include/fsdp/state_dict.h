#pragma once
/// The model's state across shards: full (gathered, original names and shapes) parameters.

#include <fsdp/fully_shard.h>
#include <fsdp/tensor_file.h>

#include <string>

namespace fsdp {

namespace detail {
NamedTensors gather_full_params(FsdpState& state);
void save_full_params(FsdpState& state, const std::string& path);
void load_full_params(FsdpState& state, const NamedTensors& tensors, const std::string& source);
void load_full_params(torch::nn::Module& module, const NamedTensors& tensors,
                      const std::string& source);
}  // namespace detail

/// Every parameter of a sharded model, unsharded, with its original name and shape, on every
/// rank (a collective: all ranks must call it). Copies: changing them does not touch the model.
///
/// Example:
///   for (auto& [name, tensor] : fsdp::gather_full_params(model)) std::cout << name << "\n";
template <class M>
NamedTensors gather_full_params(Unit<M>& root) {
  TORCH_CHECK(root.slot().state, "gather_full_params: the model is not sharded (call fully_shard)");
  return detail::gather_full_params(*root.slot().state);
}

/// Rank 0 writes the full parameters to `path` as a dict that Python's torch.load reads
/// (GPT-2-style names, original shapes); atomically. A collective: every rank calls it, and every
/// rank throws if rank 0 could not write.
template <class M>
void save_full_params(Unit<M>& root, const std::string& path) {
  TORCH_CHECK(root.slot().state, "save_full_params: the model is not sharded (call fully_shard)");
  detail::save_full_params(*root.slot().state, path);
}

/// Loads full parameters (from load_tensor_dict, e.g. a file of save_full_params or of Python's
/// torch.save(model.state_dict())) into a sharded or unsharded model. Every parameter must be
/// present with its shape; extra entries are errors too. Checks everything before it copies
/// anything, so a bad file changes nothing. `source` names the file in errors.
template <class M>
void load_full_params(Unit<M>& root, const NamedTensors& tensors, const std::string& source) {
  if (root.slot().state) {
    detail::load_full_params(*root.slot().state, tensors, source);
  } else {
    detail::load_full_params(*root.module().ptr(), tensors, source);
  }
}

}  // namespace fsdp
