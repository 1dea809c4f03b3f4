#pragma once
// FSDP inside a pipeline stage ([Note: FSDP inside a stage] in stage_sharding.cpp): the stage's
// parts gathered into one module under the model's own names, fully_shard-ed over the stage's
// data-parallel ranks, and what the schedule's Unshard, ReduceScatter and Reshard do to it.

#include <fsdp/options.h>
#include <fsdp/pipeline.h>
#include <fsdp/sharded_model.h>

#include <functional>
#include <vector>

namespace fsdp::pp {

/// A stage's parts sharded over its data-parallel group: one FSDP unit, gathered and held across
/// the step's micro-batches.
class ShardedStage final : public StageSharding {
 public:
  /// Throws, naming the option and the fix, for what does not compose with a pipeline stage.
  ShardedStage(const std::vector<Part>& parts, ProcessGroup& dp, const FullyShardOptions& options);

  /// The stage's forward through the sharded root unit.
  at::Tensor forward(const at::Tensor& x) const { return forward_(x); }
  const ShardedModel& model() const { return model_; }
  /// Whether the stage's parts are recomputed in backward (activation_checkpointing).
  bool recomputes_parts() const { return recomputes_parts_; }

  /// Gathers the parameters and holds them, gradients kept unsharded (no_sync), until reshard().
  void unshard() override;
  /// The gradients summed over the micro-batches, reduced once.
  void reduce_scatter() override;
  void reshard() override;

 private:
  std::function<at::Tensor(const at::Tensor&)> forward_;  // holds the root unit
  ShardedModel model_;
  bool recomputes_parts_ = false;
};

}  // namespace fsdp::pp
