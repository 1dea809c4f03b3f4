#include "plan/plan_layout.h"

#include "core/flat_layout.h"
#include "core/unit_rules.h"

#include <c10/util/Exception.h>

namespace fsdp::planning {

namespace {

int64_t element_size(c10::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

std::vector<int64_t> numels_of(const PlanUnit& unit) {
  std::vector<int64_t> numels;
  for (const auto& p : unit.params) numels.push_back(p.numel());
  return numels;
}

UnitLayout unit_layout(const PlanUnit& unit, const PlanSetup& setup, int position, int f, int w,
                       const Precision& precision) {
  const FullyShardOptions& options = setup.policy.fsdp;
  const FlatLayout flat = lay_out_flat(numels_of(unit), position, f);
  UnitLayout layout;
  layout.name = unit.name;
  layout.param_tensors = static_cast<int64_t>(unit.params.size());
  layout.numel = flat.numel;
  layout.shard_numel = flat.shard_numel;
  layout.piece_numel = flat.held_numel();
  layout.trainable = layout.numel > 0;
  layout.reshard_after_forward = options.unit_reshards_after_forward(unit.name);
  const bool offload = options.cpu_offload();
  const rules::FlatPlacement placement{f, w / f, precision.mixed(), offload};
  layout.unsharded_params = rules::needs_unshard(placement) ? flat.padded_numel * precision.compute_bytes : 0;
  const bool into_shard = rules::grads_into_shard(placement, /*accumulating=*/false);
  layout.unsharded_grad = into_shard || !layout.trainable ? 0 : flat.padded_numel * precision.reduce_bytes;
  const bool reduces_into_shard = rules::reduces_into_shard(/*accumulate=*/false, precision.reduce_dtype,
                                                            precision.shard_dtype, offload);
  layout.reduce_output = into_shard || reduces_into_shard || !layout.trainable
                             ? 0 : layout.shard_numel * precision.reduce_bytes;
  layout.grad_shard = layout.trainable && !offload ? layout.shard_numel * precision.shard_bytes : 0;
  layout.grads_into_shard = into_shard && layout.trainable;
  // Accumulating, gradients never go straight into the shard, and a reduction adds to it from a
  // temporary.
  layout.accumulating_grad = layout.trainable ? flat.padded_numel * precision.reduce_bytes : 0;
  const bool accumulate_reduces_into_shard =
      rules::reduces_into_shard(/*accumulate=*/true, precision.reduce_dtype, precision.shard_dtype, offload);
  layout.accumulating_reduce_output =
      layout.trainable && !accumulate_reduces_into_shard ? layout.shard_numel * precision.reduce_bytes : 0;
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
  p.shard_dtype = shard;
  p.compute_dtype = mp.param_dtype().value_or(shard);
  p.reduce_dtype = mp.reduce_dtype().value_or(p.compute_dtype);
  p.shard_bytes = element_size(p.shard_dtype);
  p.compute_bytes = element_size(p.compute_dtype);
  p.reduce_bytes = element_size(p.reduce_dtype);
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
