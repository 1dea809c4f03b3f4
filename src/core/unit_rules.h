#pragma once
// [Note: one rulebook, two readers]
// The decisions a step makes for a unit, as plain functions of a small description of it: which
// buffers it needs (an unsharded one, a reduction's temporary), where its gradients go, which
// unit a prefetch gathers. The engine (FlatParam, ParamGroup, unit_comm, StepConductor) calls
// them for each real unit; the planner (src/plan) calls them for each planned one, over the same
// cut (core/flat_layout.h). So what the planner predicts a step allocates and moves is what the
// engine does, and a rule is changed here, once. What the rate limiter counts, refuses and waits
// for, and the order of a unit's own events, are classes both run: core/limiter_count.h and
// core/unit_order.h ([Note: one order inside a unit]).

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <vector>

namespace fsdp::rules {

/// Where a unit's flat parameter is kept and computed.
struct FlatPlacement {
  int shard_group_size = 1;      ///< F
  int replicas = 1;              ///< W / F
  bool mixed_precision = false;  ///< computed in another dtype than its shard's
  bool offloaded = false;        ///< the shards in host memory, computed on a device
};

/// Forward needs a separate unsharded buffer: the shard is partial, or in another dtype, or on
/// another device.
inline bool needs_unshard(const FlatPlacement& p) {
  return p.shard_group_size > 1 || p.mixed_precision || p.offloaded;
}

/// Backward writes the gradients straight into the gradient shard, with no unsharded gradient
/// and no reduction: one rank alone (W = 1, where the reduction would be a copy), not offloaded,
/// and no sum to add to (`accumulating`: the shard holds gradients the optimizer kept, or no_sync
/// keeps the sum unsharded).
inline bool grads_into_shard(const FlatPlacement& p, bool accumulating) {
  return p.shard_group_size == 1 && p.replicas == 1 && !p.offloaded && !accumulating;
}

/// A reduction writes its result straight into the gradient shard (no temporary): it overwrites
/// the shard, in the shard's dtype, on the shard's device.
inline bool reduces_into_shard(bool accumulate, c10::ScalarType reduce_dtype, c10::ScalarType shard_dtype,
                               bool offloaded) {
  return !accumulate && reduce_dtype == shard_dtype && !offloaded;
}

/// The kind of one of a unit's parameters: it has a flat parameter per kind ([Note: a unit's
/// flat parameters]).
struct ParamKind {
  bool trainable = true;        ///< requires_grad
  bool full_precision = false;  ///< left in its own dtype by mixed precision
};

/// A unit's parameters by kind: for each kind it has, the indexes (into `kinds`) of its
/// parameters, in their order. Trainable before frozen and param_dtype before full precision:
/// the first group is the unit's main one (a unit without parameters has none).
inline std::vector<std::vector<size_t>> group_by_kind(const std::vector<ParamKind>& kinds) {
  std::vector<std::vector<size_t>> groups(4);
  for (size_t i = 0; i < kinds.size(); ++i) {
    groups[(kinds[i].trainable ? 0 : 2) + (kinds[i].full_precision ? 1 : 0)].push_back(i);
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(), [](const auto& g) { return g.empty(); }), groups.end());
  return groups;
}

/// Forward prefetch: the unit that followed `unit` in the previous iteration's forward (the
/// first one follows the root); null when none.
template <class UnitPtr>
UnitPtr forward_prefetch_target(const std::vector<UnitPtr>& previous_order, UnitPtr unit, bool is_root) {
  auto next = previous_order.begin();
  if (!is_root) {
    next = std::find(previous_order.begin(), previous_order.end(), unit);
    if (next != previous_order.end()) ++next;
  }
  return next == previous_order.end() ? nullptr : *next;
}

/// Backward prefetch: the unit whose backward comes after `unit`'s, i.e. the one before it in
/// this iteration's forward (the last one comes after the root); null when none.
template <class UnitPtr>
UnitPtr backward_prefetch_target(const std::vector<UnitPtr>& order, UnitPtr unit, bool is_root) {
  if (is_root) return order.empty() ? nullptr : order.back();
  auto it = std::find(order.rbegin(), order.rend(), unit);
  if (it == order.rend() || ++it == order.rend()) return nullptr;
  return *it;
}

}  // namespace fsdp::rules
