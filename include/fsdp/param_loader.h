#pragma once
/// Loads a model's parameters piece by piece from a source that can read element ranges (a
/// safetensors file, a memory-mapped checkpoint): each rank asks only for the elements of its own
/// shard, so loading never holds a full parameter that the source does not hand over whole.

#include <fsdp/fully_shard.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

/// Elements [begin, end) of the flattened (row-major) parameter `name`, as a tensor of
/// end - begin elements (any shape, any floating dtype: it is copied and converted).
using ParamRangeReader =
    std::function<at::Tensor(const std::string& name, int64_t begin, int64_t end)>;

/// Every parameter's original name and shape, in the model's order (sharded or not).
using ParamShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

namespace detail {
ParamShapes param_shapes(torch::nn::Module& module);
void load_params_from(torch::nn::Module& module, const ParamRangeReader& read);
}  // namespace detail

/// The names and original shapes of the model's parameters, to check a source before loading.
ParamShapes param_shapes(const ShardedModel& model);
template <class M>
ParamShapes param_shapes(const Unit<M>& root) {
  const ShardedModel* model = root.find_sharded_model();
  return model ? param_shapes(*model) : detail::param_shapes(*root.module().ptr());
}

/// Fills this rank's part of every parameter from `read`: a sharded model asks for the element
/// range of each parameter that its shard holds (nothing for a parameter it holds none of), an
/// unsharded one for whole parameters. Not a collective: each rank reads on its own. Throws if
/// `read` returns a tensor of the wrong number of elements or throws itself; check the source
/// (param_shapes) first, as a failure half-way leaves the model partly loaded.
///
/// Example:
///   fsdp::SafetensorsReader file("model.safetensors");
///   fsdp::load_params_from(model, [&](const std::string& name, int64_t begin, int64_t end) {
///     return file.read_range(name, begin, end);
///   });
void load_params_from(const ShardedModel& model, const ParamRangeReader& read);
template <class M>
void load_params_from(const Unit<M>& root, const ParamRangeReader& read) {
  if (const ShardedModel* model = root.find_sharded_model()) {
    load_params_from(*model, read);
  } else {
    detail::load_params_from(*root.module().ptr(), read);
  }
}

}  // namespace fsdp
