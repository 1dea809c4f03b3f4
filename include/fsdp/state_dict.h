#pragma once
/// The model's state across shards: full (gathered, original names and shapes) parameters, and
/// its buffers (BatchNorm's running statistics: rank 0's, as sync_buffers treats them). LibTorch
/// has no non-persistent buffers: every registered buffer is state.

#include <fsdp/fully_shard.h>
#include <fsdp/tensor_file.h>

#include <string>

namespace fsdp {

namespace detail {
/// The buffers of `module` and its submodules by full name ("stage1.bn.running_mean"): the
/// module's own tensors (copying into them changes the model).
NamedTensors module_buffers(torch::nn::Module& module);
void load_full_params(torch::nn::Module& module, const NamedTensors& tensors,
                      const std::string& source);
}  // namespace detail

/// Every parameter of a sharded model, unsharded, with its original name and shape, then every
/// buffer (rank 0's values), on every rank (a collective: all ranks must call it): the model's
/// full state dict, as PyTorch's model.state_dict() names it. Copies: changing them does not
/// touch the model.
///
/// Example:
///   for (auto& [name, tensor] : fsdp::gather_full_params(model)) std::cout << name << "\n";
/// Under tensor parallelism (parallelize.h) each parameter is made whole over the tp ranks too.
NamedTensors gather_full_params(const ShardedModel& model);

/// Rank 0 writes the full state dict (gather_full_params: parameters and buffers) to `path` as a
/// dict that Python's torch.load reads and model.load_state_dict(strict=True) takes (original
/// names and shapes); atomically. A collective: every rank calls it, and every
/// rank throws if rank 0 could not write.
void save_full_params(const ShardedModel& model, const std::string& path);

/// Loads full parameters (from load_tensor_dict, e.g. a file of save_full_params or of Python's
/// torch.save(model.state_dict())) into a sharded or unsharded model. Every parameter must be
/// present with its shape; the buffers are loaded when present (a file of parameters alone
/// leaves them as they are); other entries are errors. Between steps: units a forward left
/// unsharded are resharded first, so that the next forward gathers the loaded values. Checks everything before it copies
/// anything, so a bad file changes nothing. `source` names the file in errors.
void load_full_params(const ShardedModel& model, const NamedTensors& tensors, const std::string& source);
template <class M>
void load_full_params(const Unit<M>& root, const NamedTensors& tensors, const std::string& source) {
  if (const ShardedModel* model = root.find_sharded_model()) {
    load_full_params(*model, tensors, source);
  } else {
    detail::load_full_params(*root.module().ptr(), tensors, source);
  }
}

}  // namespace fsdp
