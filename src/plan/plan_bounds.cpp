#include "plan/plan_bounds.h"

#include <fsdp/checked_math.h>

#include <c10/util/Exception.h>

#include <optional>

namespace fsdp::planning {

namespace {

// An upper bound of what a rank holds at once: no breakdown of the replay exceeds it.
constexpr int64_t kStateBytesPerElement = 32;  // parameter, gradient, moments, unsharded copies

std::optional<int64_t> activation_bytes(const PlanActivations& a) {
  return checked_sum({a.saved, a.checkpointed, a.forward_transient, a.backward_transient});
}

// Nothing when the sum wraps: every term is the description's, any may be absurd.
std::optional<int64_t> bytes_bound(const PlanSetup& setup) {
  const PlanModel& m = setup.model;
  std::optional<int64_t> per_sequence = checked_add(m.input_bytes_per_sequence, 0);
  std::optional<int64_t> fixed = checked_sum({m.resident_bytes, m.step_all_reduce_bytes});
  const auto add = [](std::optional<int64_t>& to, std::optional<int64_t> more) {
    to = to && more ? checked_add(*to, *more) : std::nullopt;
  };
  add(per_sequence, activation_bytes(m.root_pre));
  for (const PlanUnit* unit : units_of(m)) {
    add(per_sequence, activation_bytes(unit->activations));
    add(fixed, unit->backward_workspace);
  }
  const auto states = checked_mul(m.numel(), kStateBytesPerElement);
  const auto activations = per_sequence ? checked_mul(*per_sequence, setup.policy.batch) : std::nullopt;
  if (!states || !activations || !fixed) return std::nullopt;
  return checked_sum({*states, *activations, *fixed});
}

}  // namespace

std::vector<const PlanUnit*> units_of(const PlanModel& model) {
  std::vector<const PlanUnit*> out{&model.root};
  for (const auto& unit : model.units) out.push_back(&unit);
  return out;
}

void check_plan_bounds(const PlanSetup& setup) {
  const int64_t units = static_cast<int64_t>(setup.model.units.size()) + 1;
  const int64_t world = setup.world.world_size;
  TORCH_CHECK(units <= kMaxUnitRanks / world, "plan: ", world, " ranks x ", units,
              " units (the root included) are more than the ", kMaxUnitRanks, " unit-ranks the "
              "planner replays in seconds (it replays each rank's step unit by unit); plan fewer "
              "ranks or units");
  const auto bytes = bytes_bound(setup);
  TORCH_CHECK(bytes && *bytes <= kMaxPlanBytes, "plan: the model as described counts more than ",
              kMaxPlanBytes, " bytes (1 EiB) per rank at batch ", setup.policy.batch, " (",
              kStateBytesPerElement, " bytes per parameter element, every unit's activations at "
              "once): beyond any device and beyond what the planner counts without overflow; "
              "describe the model's real sizes");
}

}  // namespace fsdp::planning
