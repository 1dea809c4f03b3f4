#pragma once
/// The planner for pipeline parallelism: each pp rank's peak memory (its stages' parameters,
/// gradients and optimizer state, sharded over the stage's dp ranks as Stage::fully_shard shards
/// them, and the activations its schedule keeps in flight), the bytes a step sends (FSDP's
/// once-per-step gathers and reductions, the pipeline's send/recv), the bubble and the step time.
/// In-flight activations are counted by walking the action list the runner executes
/// (fsdp::pp::rank_actions), not by a formula. docs/planner.md ("Pipeline parallelism").
///
/// Example:
///   fsdp::PlanSetup setup = ...;  // the whole model, world = P x D x T ranks
///   fsdp::PlanPipeline pipeline;
///   pipeline.pp_size = 8;
///   pipeline.schedule = fsdp::pp::Schedule::Interleaved1F1B;
///   pipeline.stages_per_rank = 2;
///   pipeline.microbatches = 16;
///   std::cout << fsdp::pipeline_plan_text(fsdp::plan_pipeline(setup, pipeline));

#include <fsdp/pipeline.h>
#include <fsdp/plan.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdp {

/// How the model is pipelined. The setup's batch is one micro-batch's sequences per dp rank.
struct PlanPipeline {
  pp::Schedule schedule = pp::Schedule::OneFOneB;
  int pp_size = 1;
  int stages_per_rank = 1;  ///< V: interleaved 1F1B any, ZBV 2, GPipe and 1F1B 1
  int microbatches = 1;
  /// Each stage is sharded over its dp ranks when there are several (Stage::fully_shard with the
  /// setup's strategy); false: every stage is whole on each of its ranks.
  bool shard_stages = true;
  /// A stage is sharded over a dp group of one rank too (what checkpoints of a pipeline need:
  /// include/fsdp/pipeline_checkpoint.h). Mixed precision and activation checkpointing shard it
  /// regardless: they come with Stage::fully_shard.
  bool shard_alone = false;
  /// The program builds the whole model on every rank and keeps it (gpt_train does): the other
  /// stages' parameters are the program's own memory. False: a rank holds its stages only.
  bool whole_model_on_every_rank = false;
  /// The last stage holds the embedding's weight ("wte") again, a head tied to it (GPT-2's), and
  /// with the two stages on two ranks each sends its copy's gradient to the other
  /// ([Note: tied weights across stages]).
  bool head_tied_to_embedding = false;
  /// Which of the root's parameters sit before the units (on the first stage); the rest (the
  /// final norm, the head) are the last stage's. Default: names with "wte", "wpe" or "embed".
  std::function<bool(const PlanParam&)> before_units;
};

/// The most micro-batches `stage` holds between a forward and the backward that frees them, walking
/// `actions` (a rank's list, pp::rank_actions): a Forward adds one, a Backward or a BackwardWeight
/// (ZBV's W, which frees the graph) removes one. The same walk plan_pipeline takes for its peaks.
int max_in_flight(const std::vector<pp::Action>& actions, int stage);

/// One pp rank's stages at its peak (the rank of dp and tp coordinate 0 of that pp coordinate).
struct PipelineRankPlan {
  int pp_rank = 0;
  std::vector<int> stages;
  std::vector<std::string> units;    ///< the units its stages hold, in order
  int64_t parameters = 0;            ///< its stages' parameter elements (whole, before sharding)
  int64_t microbatch_activations = 0;  ///< one micro-batch's activations, summed over its stages
  int in_flight = 0;                 ///< micro-batches in flight at the peak, each stage's counted (V > 1: (stage, micro-batch) pairs)
  MemoryBreakdown peak;
  std::string peak_at;
  int64_t pp_send_bytes = 0;   ///< comm_stats' pp_send_bytes per step
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;  ///< FSDP's inside its stages, per step
  double busy_s = 0;           ///< its stages' forwards and backwards over the step's micro-batches
};

struct PipelinePlan {
  PlanSetup setup;
  PlanPipeline pipeline;
  int dp_size = 1;
  std::vector<PipelineRankPlan> ranks;  ///< one per pp rank
  int64_t peak_bytes = 0;               ///< the largest over the ranks
  int peak_rank = 0;
  double bubble = 0;                    ///< the schedule's idle fraction (docs/pipeline-parallel.md)
  bool pp_crosses_hosts = false;        ///< a stage boundary crosses hosts
  PlanTime time;
  double headroom = 0;
  bool fits = true;
  bool at_risk = false;
  std::string label() const;  ///< e.g. "pp 8 interleaved-1f1b V=2 M=16 x full F=8 TP=8 bf16 batch 1"
};

/// Plans `setup` (the whole model; world = pp_size x dp x tp ranks, the mesh pp x dp x tp) as
/// `pipeline`. Throws naming the input it cannot plan (a pp size that does not divide the world,
/// fewer units than stages, a schedule's refusal, hybrid sharding or CPU offload inside a stage).
/// Activation checkpointing is planned as fsdp::pp runs it inside a stage: each unit's output
/// kept, one unit recomputed at a time.
PipelinePlan plan_pipeline(const PlanSetup& setup, const PlanPipeline& pipeline);

std::string pipeline_plan_text(const PipelinePlan& plan);
nlohmann::json pipeline_plan_json(const PipelinePlan& plan);

/// What a pipeline search tries: (pp size, micro-batch count) pairs (a pair per pp size keeps a
/// global batch: gpt_train's M·P constant), each under every schedule (interleaved 1F1B at
/// `interleaved_stages_per_rank`).
struct PipelineSearchSpace {
  std::vector<std::pair<int, int>> pp_and_microbatches;
  std::vector<pp::Schedule> schedules = {pp::Schedule::GPipe, pp::Schedule::OneFOneB,
                                         pp::Schedule::Interleaved1F1B};
  int interleaved_stages_per_rank = 2;
  double peak_margin = 0;  ///< a plan fits only at peak <= (1 - margin) x the cap
};

struct PipelineSearchResult {
  std::vector<PipelinePlan> fitting;  ///< fastest first (tokens/s)
  std::vector<std::pair<PipelinePlan, std::string>> rejected;  ///< with why
  std::vector<std::string> not_planned;  ///< combinations refused (e.g. 1F1B with M < P), with why
  const PipelinePlan* best() const { return fitting.empty() ? nullptr : &fitting.front(); }
};

/// Every combination of `space` around `setup` and `base` (its other fields), planned.
PipelineSearchResult search_pipeline_plans(const PlanSetup& setup, const PlanPipeline& base,
                                           const PipelineSearchSpace& space, double max_memory_bytes);
std::string pipeline_search_text(const PipelineSearchResult& result, double max_memory_bytes);

}  // namespace fsdp
