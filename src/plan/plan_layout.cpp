#include "plan/plan_layout.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp::planning {

namespace {

int64_t element_size(c10::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// This rank's shard is [position·S, (position+1)·S) of the padded flat buffer; a parameter holds
// [offset, offset + numel) of it. The overlap is the parameter's piece on this rank.
int64_t piece_elements(int64_t offset, int64_t numel, int64_t shard_begin, int64_t shard_end) {
  return std::max<int64_t>(0, std::min(offset + numel, shard_end) - std::max(offset, shard_begin));
}

UnitLayout unit_layout(const PlanUnit& unit, const PlanSetup& setup, int position, int f, int w,
                       const Precision& precision) {
  const FullyShardOptions& options = setup.policy.fsdp;
  UnitLayout layout;
  layout.name = unit.name;
  layout.param_tensors = static_cast<int64_t>(unit.params.size());
  for (const auto& p : unit.params) layout.numel += p.numel();
  layout.shard_numel = (layout.numel + f - 1) / f;
  const int64_t begin = position * layout.shard_numel, end = begin + layout.shard_numel;
  int64_t offset = 0;
  for (const auto& p : unit.params) {
    layout.piece_numel += piece_elements(offset, p.numel(), begin, end);
    offset += p.numel();
  }
  layout.trainable = layout.numel > 0;
  layout.reshard_after_forward = options.unit_reshards_after_forward(unit.name);
  const int64_t padded = layout.shard_numel * f;
  const bool offload = options.cpu_offload();
  // FlatParam::needs_unshard: a partial shard, another dtype or another device.
  const bool needs_unshard = f > 1 || precision.mixed() || offload;
  layout.unsharded_params = needs_unshard ? padded * precision.compute_bytes : 0;
  // ParamGroup::grads_need_no_reduction: one rank alone writes gradients into its shard.
  const bool into_shard = w == 1 && !offload;
  layout.unsharded_grad = into_shard || !layout.trainable ? 0 : padded * precision.reduce_bytes;
  // reduce_unit_gradient reduces straight into the gradient shard when the dtypes agree.
  const bool reduces_into_shard = precision.reduce_bytes == precision.shard_bytes && !offload;
  layout.reduce_output = into_shard || reduces_into_shard || !layout.trainable
                             ? 0 : layout.shard_numel * precision.reduce_bytes;
  layout.grad_shard = layout.trainable && !offload ? layout.shard_numel * precision.shard_bytes : 0;
  layout.grads_into_shard = into_shard && layout.trainable;
  layout.accumulating_grad = layout.trainable ? padded * precision.reduce_bytes : 0;
  layout.accumulating_reduce_output = layout.trainable ? layout.shard_numel * precision.reduce_bytes : 0;
  return layout;
}

}  // namespace

Precision precision_of(const PlanModel& model, const FullyShardOptions& options) {
  Precision p;
  c10::ScalarType shard = c10::kFloat;
  if (!model.root.params.empty()) shard = model.root.params.front().dtype;
  for (const auto& unit : model.units) {
    if (!unit.params.empty()) shard = unit.params.front().dtype;
  }
  const auto& mp = options.mixed_precision();
  const c10::ScalarType compute = mp.param_dtype().value_or(shard);
  p.shard_bytes = element_size(shard);
  p.compute_bytes = element_size(compute);
  p.reduce_bytes = element_size(mp.reduce_dtype().value_or(compute));
  return p;
}

void validate_setup(const PlanSetup& setup) {
  const PlanWorld& world = setup.world;
  TORCH_CHECK(world.world_size >= 1, "plan: the world size must be >= 1, got ", world.world_size);
  TORCH_CHECK(world.ranks_per_host >= 1 && world.ranks_per_host <= world.world_size &&
                  world.world_size % world.ranks_per_host == 0,
              "plan: ranks per host (", world.ranks_per_host, ") must divide the world size (",
              world.world_size, ")");
  TORCH_CHECK(setup.policy.batch >= 1, "plan: the batch per rank must be >= 1, got ", setup.policy.batch);
  TORCH_CHECK(setup.policy.micro_batches >= 1, "plan: the micro-batches per step must be >= 1, got ",
              setup.policy.micro_batches);
  setup.policy.fsdp.validate(world.world_size, world.ranks_per_host);
  const auto& mp = setup.policy.fsdp.mixed_precision();
  const c10::ScalarType compute =
      mp.param_dtype().value_or(setup.model.root.params.empty() ? c10::kFloat
                                                                : setup.model.root.params.front().dtype);
  TORCH_CHECK(compute == setup.model.compute_dtype, "plan: the model's activations were described "
              "for ", c10::toString(setup.model.compute_dtype), " but the policy computes in ",
              c10::toString(compute), "; describe the model for the policy's param_dtype");
}

RankLayout layout_for_rank(const PlanSetup& setup, int rank) {
  RankLayout layout;
  layout.rank = rank;
  const int w = setup.world.world_size;
  layout.shard_group_size = setup.policy.fsdp.shard_group_size_for(w, setup.world.ranks_per_host);
  layout.replicas = w / layout.shard_group_size;
  layout.precision = precision_of(setup.model, setup.policy.fsdp);
  const int position = rank % layout.shard_group_size;  // shard groups: consecutive ranks
  layout.units.push_back(unit_layout(setup.model.root, setup, position, layout.shard_group_size, w,
                                     layout.precision));
  layout.units.front().reshard_after_forward = false;  // the root keeps its parameters for backward
  for (const auto& unit : setup.model.units) {
    layout.units.push_back(unit_layout(unit, setup, position, layout.shard_group_size, w, layout.precision));
  }
  return layout;
}

}  // namespace fsdp::planning
