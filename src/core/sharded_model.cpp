// fsdp::ShardedModel ([Note: one handle behind the face]): the handle's own questions, answered
// from the engine's units.
#include "core/sharded_model.h"

#include "core/fsdp_state.h"

namespace fsdp {

namespace {

FlatInfo info_of(const FlatParam& flat) {
  FlatInfo info;
  info.num_params = static_cast<int64_t>(flat.entries().size());
  info.numel = flat.numel();
  info.padded_numel = flat.padded_numel();
  info.shard_numel = flat.shard_numel();
  info.element_size = flat.element_size();
  info.compute_element_size = flat.compute_element_size();
  info.trainable = flat.requires_grad();
  return info;
}

UnitInfo info_of(const ParamGroup& unit) {
  UnitInfo info;
  info.name = unit.name();
  info.is_root = unit.is_root();
  for (const FlatGroup& g : unit.flats()) {
    const FlatInfo flat = info_of(g.flat);
    info.num_params += flat.num_params;
    info.numel += flat.numel;
    info.padded_numel += flat.padded_numel;
    info.shard_numel += flat.shard_numel;
    info.shard_bytes += flat.shard_numel * flat.element_size;
    info.unsharded_bytes += flat.padded_numel * flat.compute_element_size;
    info.flats.push_back(flat);
  }
  return info;
}

}  // namespace

ShardedModel::ShardedModel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::vector<UnitInfo> ShardedModel::units() const {
  std::vector<UnitInfo> infos;
  for (const auto& unit : impl_->engine->units()) infos.push_back(info_of(*unit));
  return infos;
}

torch::nn::Module& ShardedModel::module() const { return *impl_->module; }

}  // namespace fsdp
