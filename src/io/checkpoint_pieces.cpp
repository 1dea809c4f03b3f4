#include "io/checkpoint_pieces.h"
#include "io/global_boxes.h"

#include <c10/util/Exception.h>

namespace fsdp::detail {

std::vector<ShardedParam> local_pieces(const ShardedView& model) {
  std::vector<ShardedParam> pieces;
  for (const auto& buffer : model.buffers()) {
    buffer.reshard_unless_in_backward();  // [Note: resharding between steps]
    TORCH_CHECK(buffer.holds_shard_only(), "unit '", buffer.unit_name(), "' is unsharded: save "
                "and load checkpoints between steps, not between a forward and its backward");
    pieces.insert(pieces.end(), buffer.params().begin(), buffer.params().end());
  }
  return pieces;
}

std::vector<ParamMeta> describe_model(const ShardedView& model, const OptimizerSet& optimizers) {
  std::vector<ParamMeta> params;
  for (const auto& p : model.params()) {
    // The whole parameter's shape, also where this rank holds a tensor-parallel part of it.
    ParamMeta meta{p.name(), part_in_whole(p).whole_shape,
                   std::string(c10::toString(p.param().scalar_type())), {}, {}, {}};
    if (const auto k = optimizers.holder(p.param())) meta.optimizer = optimizers.state(*k).name();
    if (const auto saved = optimizers.read(p.param())) {
      meta.step = saved->step;
      for (const auto& item : saved->tensors) meta.moments.push_back(item.first);
    }
    params.push_back(std::move(meta));
  }
  return params;
}

std::vector<BufferMeta> describe_buffers(const NamedTensors& buffers) {
  std::vector<BufferMeta> out;
  for (const auto& [name, buffer] : buffers) {
    out.push_back(BufferMeta{name, buffer.sizes().vec(), std::string(c10::toString(buffer.scalar_type())), {}, 0});
  }
  return out;
}

}  // namespace fsdp::detail
