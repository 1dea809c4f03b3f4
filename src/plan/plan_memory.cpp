#include "plan/plan_memory.h"

#include "plan/plan_optimizer.h"
#include "plan/planned_step.h"

#include <string>
#include <vector>

namespace fsdp::planning {

namespace {

std::vector<MicroBatch> micro_batch_kinds(const PlanPolicy& policy) {
  const int64_t n = policy.micro_batches;
  if (n == 1) return {MicroBatch{}};
  if (!policy.no_sync) {
    return {MicroBatch{1, false, false, true, /*last=*/false}, MicroBatch{2, /*shards_hold_sum=*/true}};
  }
  std::vector<MicroBatch> kinds = {MicroBatch{1, false, false, /*reduces=*/false, false}};
  if (n > 2) kinds.push_back(MicroBatch{2, false, /*full_grads_kept=*/true, false, false});
  kinds.push_back(MicroBatch{n, false, true, true, true});
  return kinds;
}

// [Note: the staging arena in the plan]
// An asynchronous save's arena (src/io/async_checkpoint.cpp keeps it from the first save on)
// holds what a rank of the first replica (ranks [0, W/R)) writes: its pieces of the parameters (padding
// excluded) and their optimizer state; the other replicas write nothing. The alignment of each
// copy (64 bytes), the steps and rank 0's buffers are left out: a few kB.
int64_t staging_arena_bytes(const PlanSetup& setup, const RankLayout& layout, int64_t optimizer_state) {
  const int64_t budget = setup.policy.async_save_staging_bytes;
  if (budget < 0 || layout.rank >= setup.world.world_size / layout.replicas) return 0;
  int64_t pieces = 0;
  for (const auto& unit : layout.units) {
    for (const FlatGroupLayout& g : unit.flats) pieces += g.piece_numel * g.shard_bytes;
  }
  const int64_t staged = pieces + optimizer_state;
  return budget > 0 && budget < staged ? budget : staged;
}

std::string micro_batch_text(const MicroBatch& micro, const PlanPolicy& policy) {
  if (policy.micro_batches == 1) return "";
  const bool representative = !policy.no_sync && micro.index == 2;  // stands for 2..n
  return " (micro-batch " + std::to_string(micro.index) +
         (representative && policy.micro_batches > 2 ? "-" + std::to_string(policy.micro_batches) : "") +
         " of " + std::to_string(policy.micro_batches) + ")";
}

}  // namespace

RankMemory replay_step_memory(const PlanSetup& setup, const RankLayout& layout) {
  RankMemory rank;
  rank.rank = layout.rank;
  // The step starts after zero_grad: no gradient shard yet ([Note: gradient shards live as long
  // as the gradients]), backward allocates them; unless zero_grad zeroed them in place.
  MemoryBreakdown start;
  int64_t grad_shards = 0, full_grads = 0;
  for (const auto& unit : layout.units) {
    for (const FlatGroupLayout& g : unit.flats) {
      start.sharded_params += g.shard_numel * g.shard_bytes;
      if (!g.trainable) continue;  // frozen: no gradient, no optimizer state
      grad_shards += g.shard_numel * g.shard_bytes;
      start.optimizer_state +=
          optimizer_totals(setup.policy.optimizer, g.piece_numel, g.muon_piece_numel, g.shard_bytes).state;
    }
    full_grads += unit.accumulating_grad;
  }
  rank.model_states = start.sharded_params + grad_shards + start.optimizer_state;
  rank.staging_bytes = staging_arena_bytes(setup, layout, start.optimizer_state);
  if (!setup.policy.fsdp.device() || !setup.policy.fsdp.device()->is_cuda()) start.staging = rank.staging_bytes;
  const bool offload = setup.policy.fsdp.cpu_offload();
  if (offload) {  // model states in host memory
    rank.offloaded_bytes = rank.model_states;
    start.sharded_params = start.optimizer_state = 0;
  }
  start.program = setup.model.resident_bytes + setup.policy.batch * setup.model.input_bytes_per_sequence;
  bool first = true;
  for (const MicroBatch& micro : micro_batch_kinds(setup.policy)) {
    MemoryBreakdown begin = start;
    if (!offload && (setup.policy.gradients_kept || micro.shards_hold_sum)) begin.sharded_grads = grad_shards;
    if (micro.full_grads_kept) begin.unsharded_grads = full_grads;
    const PlannedStep step = run_planned_step(setup, layout, micro, begin, micro_batch_text(micro, setup.policy));
    const Timeline& timeline = step.timeline;
    if (first || timeline.peak().total() > rank.peak.total()) {
      rank.peak = timeline.peak();
      rank.peak_at = timeline.peak_at();
    }
    first = false;
  }
  return rank;
}

}  // namespace fsdp::planning
