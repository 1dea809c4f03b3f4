#include <fsdp/plan.h>

#include "plan/plan_bounds.h"
#include "plan/plan_layout.h"
#include "plan/plan_memory.h"
#include "plan/plan_time.h"
#include "plan/plan_traffic.h"
#include "plan/planned_step.h"

#include <fsdp/checked_math.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <sstream>

namespace fsdp {

int64_t PlanParam::numel() const {
  const auto n = checked_product(shape);
  TORCH_CHECK(n, "plan: parameter '", name, "' has more elements than int64 counts (a dimension of ",
              "its shape is absurd); describe the model's real sizes");
  return *n;
}

int64_t PlanModel::numel() const {
  std::optional<int64_t> n = 0;
  for (const PlanUnit* unit : planning::units_of(*this)) {
    for (const auto& p : unit->params) {
      if (n) n = checked_add(*n, p.numel());
    }
  }
  TORCH_CHECK(n, "plan: the model has more parameter elements than int64 counts; describe the "
              "model's real sizes");
  return *n;
}

int64_t MemoryBreakdown::total() const {
  return sharded_params + sharded_grads + optimizer_state + unsharded_params + unsharded_grads +
         activations + workspace + program;
}

std::string Plan::label() const {
  const FullyShardOptions& o = setup.policy.fsdp;
  std::ostringstream s;
  s << to_string(o.strategy()) << " F=" << shard_group_size;
  if (o.mixed_precision().param_dtype()) s << " " << c10::toString(*o.mixed_precision().param_dtype());
  if (o.activation_checkpointing()) s << " AC";
  if (o.cpu_offload()) s << " offload";
  s << " batch " << setup.policy.batch;
  if (setup.policy.micro_batches > 1) {
    s << " x " << setup.policy.micro_batches << " micro-batches" << (setup.policy.no_sync ? " no_sync" : "");
  }
  return s.str();
}

Plan plan(const PlanSetup& setup) {
  planning::validate_setup(setup);
  planning::check_plan_bounds(setup);
  Plan result;
  result.setup = setup;
  for (int rank = 0; rank < setup.world.world_size; ++rank) {
    const planning::RankLayout layout = planning::layout_for_rank(setup, rank);
    RankMemory memory = planning::replay_step_memory(setup, layout);
    result.peak_bytes = std::max(result.peak_bytes, memory.peak.total());
    result.ranks.push_back(std::move(memory));
    if (rank == 0) {
      result.shard_group_size = layout.shard_group_size;
      result.replicas = layout.replicas;
      // One micro-batch as the conductor runs it: its collectives and their overlap.
      const planning::PlannedStep step = planning::run_planned_step(setup, layout, planning::MicroBatch{}, {}, "");
      const auto program = planning::program_collectives(setup);
      std::vector<planning::PlannedCollective> collectives = step.collectives;
      collectives.insert(collectives.end(), program.begin(), program.end());
      result.traffic = planning::total_traffic(setup, collectives);
      result.time = planning::step_time(setup, layout, step, program);
    }
  }
  const double memory = setup.device.memory_bytes;
  if (memory > 0) {
    result.headroom = 1.0 - static_cast<double>(result.peak_bytes) / memory;
    result.fits = result.headroom >= 0;
    result.at_risk = result.fits && result.headroom < setup.device.allocator_reserve;
  }
  if (setup.device.host_memory_bytes > 0) {
    for (const auto& rank : result.ranks) {
      if (static_cast<double>(rank.offloaded_bytes) > setup.device.host_memory_bytes) result.host_fits = false;
    }
    result.fits = result.fits && result.host_fits;
  }
  return result;
}

}  // namespace fsdp
