#include "io/checkpoint_pieces.h"


#include <c10/util/Exception.h>

namespace fsdp::detail {

std::vector<LocalPiece> local_pieces(FsdpState& state) {
  std::vector<LocalPiece> pieces;
  for (auto& group : state.units()) {
    group->reshard_unless_in_backward();  // [Note: resharding between steps]
    TORCH_CHECK(group->sharded_state() == ShardedState::Sharded || !group->flats().front().flat.sharded(),
                "unit '", group->name(), "' is unsharded: save and load checkpoints between "
                "steps, not between a forward and its backward");
  }
  for (FlatParam* flat_param : state.flat_params()) {
    FlatParam& flat = *flat_param;
    for (auto& e : flat.entries()) {
      const auto [begin, end] = flat.local_range(e);
      pieces.push_back(LocalPiece{&e, e.in_shard(flat.shard()), begin, end});
    }
  }
  return pieces;
}

std::vector<ParamMeta> describe_model(FsdpState& state, const OptimizerState& optimizer) {
  std::vector<ParamMeta> params;
  for (FlatParam* flat : state.flat_params()) {
    for (auto& e : flat->entries()) {
      ParamMeta meta{e.name, e.shape, std::string(c10::toString(e.param.scalar_type())), {}, {}};
      if (const auto saved = optimizer.read(e.param)) {
        meta.step = saved->step;
        for (const auto& item : saved->tensors) meta.moments.push_back(item.first);
      }
      params.push_back(std::move(meta));
    }
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
