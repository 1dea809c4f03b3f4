#include "plan/plan_layout.h"

#include "core/flat_layout.h"
#include "core/unit_rules.h"
#include "plan/plan_muon.h"

#include <c10/util/Exception.h>

namespace fsdp::planning {

namespace {

int64_t element_size(c10::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// The flat group of `unit`'s parameters `group` (indexes into unit.params); each parameter's
// piece of this rank's shard goes into `pieces` (indexed like unit.params).
FlatGroupLayout group_layout(const PlanUnit& unit, bool is_root, const std::vector<size_t>& group,
                             const PlanSetup& setup, int position, int f, int w, const Precision& precision,
                             std::vector<int64_t>& pieces) {
  std::vector<int64_t> numels;
  for (size_t i : group) numels.push_back(unit.params[i].numel());
  const PlanParam& kind = unit.params[group.front()];
  const FlatLayout flat = lay_out_flat(numels, position, f);
  const bool muon = plans_muon(setup.policy.optimizer);
  int64_t muon_pieces = 0;
  for (size_t k = 0; k < group.size(); ++k) {
    const EntryLayout& e = flat.entries[k];
    pieces[group[k]] = e.shard_end - e.shard_begin;
    if (muon && steps_with_muon(unit.params[group[k]], is_root)) muon_pieces += pieces[group[k]];
  }
  const bool offload = setup.policy.fsdp.cpu_offload();
  // Mixed precision leaves a full-precision group in its own dtype, gathered and reduced in it.
  const bool mixed = precision.mixed() && !kind.full_precision;
  const int64_t own_bytes = element_size(kind.dtype);
  FlatGroupLayout g;
  g.trainable = kind.requires_grad;
  g.numel = flat.numel;
  g.shard_numel = flat.shard_numel;
  g.piece_numel = flat.held_numel();
  g.muon_piece_numel = muon_pieces;
  g.shard_bytes = own_bytes;
  g.gather_bytes = mixed ? precision.compute_bytes : own_bytes;
  g.reduce_bytes = mixed ? precision.reduce_bytes : own_bytes;
  const rules::FlatPlacement placement{f, w / f, mixed, offload};
  g.needs_unshard = rules::needs_unshard(placement);
  g.unsharded_params = g.needs_unshard ? flat.padded_numel * g.gather_bytes : 0;
  if (!g.trainable) return g;
  const c10::ScalarType reduce_dtype = mixed ? precision.reduce_dtype : kind.dtype;
  const bool into_shard = rules::grads_into_shard(placement, /*accumulating=*/false);
  g.unsharded_grad = into_shard ? 0 : flat.padded_numel * g.reduce_bytes;
  const bool reduces_into_shard = rules::reduces_into_shard(/*accumulate=*/false, reduce_dtype, kind.dtype, offload);
  g.reduce_output = into_shard || reduces_into_shard ? 0 : g.shard_numel * g.reduce_bytes;
  g.grad_shard = offload ? 0 : g.shard_numel * g.shard_bytes;
  g.grads_into_shard = into_shard;
  // Accumulating, gradients never go straight into the shard, and a reduction adds to it from a
  // temporary.
  g.accumulating_grad = flat.padded_numel * g.reduce_bytes;
  const bool accumulate_reduces_into_shard =
      rules::reduces_into_shard(/*accumulate=*/true, reduce_dtype, kind.dtype, offload);
  g.accumulating_reduce_output = accumulate_reduces_into_shard ? 0 : g.shard_numel * g.reduce_bytes;
  return g;
}

// The engine's grouping of `unit`'s parameters (rules::group_by_kind).
std::vector<std::vector<size_t>> groups_of(const PlanUnit& unit) {
  std::vector<rules::ParamKind> kinds;
  for (const auto& p : unit.params) kinds.push_back({p.requires_grad, p.full_precision});
  return rules::group_by_kind(kinds);
}

UnitLayout unit_layout(const PlanUnit& unit, bool is_root, const PlanSetup& setup, int position, int f, int w,
                       const Precision& precision) {
  UnitLayout layout;
  layout.name = unit.name;
  layout.param_tensors = static_cast<int64_t>(unit.params.size());
  layout.param_pieces.assign(unit.params.size(), 0);
  layout.reshard_after_forward = setup.policy.fsdp.unit_reshards_after_forward(unit.name);
  for (const auto& group : groups_of(unit)) {
    const FlatGroupLayout g =
        group_layout(unit, is_root, group, setup, position, f, w, precision, layout.param_pieces);
    layout.flats.push_back(g);
    layout.numel += g.numel;
    layout.shard_numel += g.shard_numel;
    layout.piece_numel += g.piece_numel;
    layout.muon_piece_numel += g.muon_piece_numel;
    if (g.trainable) layout.trainable_piece_numel += g.piece_numel;
    layout.trainable = layout.trainable || g.trainable;
    layout.needs_unshard = layout.needs_unshard || g.needs_unshard;
    layout.unsharded_params += g.unsharded_params;
    layout.grad_shard += g.grad_shard;
    layout.accumulating_grad += g.accumulating_grad;
  }
  if (layout.flats.empty()) {  // the engine's unit without parameters: one empty flat parameter
    layout.needs_unshard = rules::needs_unshard({f, w / f, precision.mixed(), setup.policy.fsdp.cpu_offload()});
  }
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
  TORCH_CHECK(setup.policy.async_save_staging_bytes >= -1, "plan: async_save_staging_bytes must be -1 (no "
              "asynchronous save), 0 (one rank's shards) or a budget in bytes, got ",
              setup.policy.async_save_staging_bytes);
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
  layout.units.push_back(unit_layout(setup.model.root, /*is_root=*/true, setup, position, layout.shard_group_size,
                                     w, layout.precision));
  layout.units.front().reshard_after_forward = false;  // the root keeps its parameters for backward
  for (const auto& unit : setup.model.units) {
    layout.units.push_back(
        unit_layout(unit, /*is_root=*/false, setup, position, layout.shard_group_size, w, layout.precision));
  }
  return layout;
}

}  // namespace fsdp::planning
