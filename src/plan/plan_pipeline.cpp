// The planner for pipeline parallelism (include/fsdp/plan_pipeline.h).
//
// [Note: a pipeline in the plan]
// The model is split as gpt_train splits it (examples/gpt/pipeline_model.cpp): the units evenly
// over P·V stages, the first stages taking one more; the root's parameters before the units (the
// embeddings) on the first stage, the rest (the final norm, the head) on the last. Per pp rank:
// - model states: its stages' parameters, gradients and optimizer state. A stage sharded over its
//   D dp ranks (D > 1, or D = 1 under mixed precision, activation
//   checkpointing or checkpoints: stages_sharded) keeps its shards (ceil(Ψ/D) per flat group), their optimizer state, and for
//   the whole step its gathered parameters and one unsharded gradient sum in the shards' dtype
//   ([Note: FSDP inside a stage], [Note: a kept gradient summed wide]), beside which a backward in
//   a narrower compute dtype writes its own gradient; a whole stage keeps its parameters, their gradients and state.
// - activations: one micro-batch's per stage is what its units keep (each block's `saved`, its
//   output included), plus the stage's input (the embeddings' output on the first stage, the
//   received activation elsewhere) and, on the last, the head's. The micro-batches a stage holds
//   at once are counted by walking the rank's action list (pp::rank_actions, the list the runner
//   executes): the peak is the most bytes in flight, plus the transient of a backward (the
//   received gradient, a unit's backward transient and weight-gradient workspace).
// - the program: the batch (every rank concatenates the step's inputs and targets, int64), its own
//   tensors, and with whole_model_on_every_rank the other stages' parameters.
// Bytes: FSDP's all-gather (D-1)·S·e and reduce-scatter (D-1)·S·4 once per stage per step;
// pp_send_bytes M·(a + 80) per boundary a stage has with another rank (a: one micro-batch's
// boundary activation, 80: the header). Time: each rank's busy time (its stages' forwards and
// backwards, the time model's per unit, for M micro-batches) over 1 - bubble, plus the gathers at
// the start, the reductions at the end, the messages of one fill and drain and the optimizer pass.

#include <fsdp/plan_pipeline.h>

#include "plan/bytes_text.h"
#include "plan/plan_optimizer.h"
#include "plan/plan_time.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <sstream>

namespace fsdp {

namespace {

constexpr int64_t kHeaderBytes = 80;  // a message's header: dtype, dims, 8 sizes (int64)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool embedding_name(const PlanParam& p) {
  return p.name.find("wte") != std::string::npos || p.name.find("wpe") != std::string::npos ||
         p.name.find("embed") != std::string::npos;
}

// The stage of each unit: evenly, the first stages one more (examples/gpt/pipeline_model.cpp).
std::vector<int> unit_stages(int64_t units, int num_stages) {
  std::vector<int> out;
  const int64_t base = units / num_stages, extra = units % num_stages;
  for (int s = 0; s < num_stages; ++s) {
    for (int64_t i = 0; i < base + (s < extra ? 1 : 0); ++i) out.push_back(s);
  }
  return out;
}

// One stage's parameters by kind, and one micro-batch's activations (per sequence).
struct StageModel {
  int64_t trainable = 0, frozen = 0;
  int64_t trainable_bytes = 0, frozen_bytes = 0;  // in the parameters' own dtypes
  int64_t saved = 0;          // per sequence, kept from its forward to its backward
  int64_t checkpointed = 0;   // the same under activation checkpointing: each unit's output
  int64_t recomputed = 0;     // the most one unit saves again when its backward recomputes it
  int64_t boundary = 0;       // per sequence, its output sent to the next stage
  int64_t backward_transient = 0, forward_transient = 0, workspace = 0;  // the units'
  // The embedding's or the head's backward transient: never recomputed, so it runs before (the
  // head) or after (the embedding) the units' recomputed activations live, never beside them.
  int64_t root_backward_transient = 0;
  std::vector<const PlanUnit*> units;
  bool with_root_pre = false, with_head = false;
  int64_t tied_bytes = 0;  // on the first and last stage: the tensor a tied head shares with the embedding
  std::vector<std::string> names;
};

void add_params(StageModel& s, const std::vector<PlanParam>& params) {
  for (const PlanParam& p : params) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(c10::elementSize(p.dtype));
    (p.requires_grad ? s.trainable : s.frozen) += p.numel();
    (p.requires_grad ? s.trainable_bytes : s.frozen_bytes) += bytes;
  }
}

std::vector<StageModel> split_model(const PlanModel& model, const PlanPipeline& pipeline, int num_stages) {
  TORCH_CHECK(static_cast<int64_t>(model.units.size()) >= num_stages, "pipeline plan: ", num_stages,
              " stages (pp ", pipeline.pp_size, " x ", pipeline.stages_per_rank, " per rank) need at least ",
              num_stages, " units; the model has ", model.units.size(), " (give fewer stages or more layers)");
  const auto before = pipeline.before_units ? pipeline.before_units : embedding_name;
  std::vector<PlanParam> first, last;
  for (const PlanParam& p : model.root.params) (before(p) ? first : last).push_back(p);
  std::vector<StageModel> stages(static_cast<size_t>(num_stages));
  const std::vector<int> of = unit_stages(static_cast<int64_t>(model.units.size()), num_stages);
  for (size_t u = 0; u < model.units.size(); ++u) {
    StageModel& s = stages[static_cast<size_t>(of[u])];
    const PlanUnit& unit = model.units[u];
    if (s.units.empty() && u > 0) {  // its input, received
      s.saved += model.units[u - 1].activations.checkpointed;
      s.checkpointed += model.units[u - 1].activations.checkpointed;
    }
    s.units.push_back(&unit);
    s.names.push_back(unit.name);
    add_params(s, unit.params);
    s.saved += unit.activations.saved;
    s.checkpointed += unit.activations.checkpointed;
    s.recomputed = std::max(s.recomputed, unit.activations.saved);
    s.boundary = unit.activations.checkpointed;
    s.forward_transient = std::max(s.forward_transient, unit.activations.forward_transient);
    s.backward_transient = std::max(s.backward_transient, unit.activations.backward_transient);
    s.workspace = std::max(s.workspace, unit.backward_workspace);
  }
  StageModel& head = stages.back();
  StageModel& embed = stages.front();
  add_params(embed, first);
  embed.with_root_pre = true;
  embed.saved += model.root_pre.saved;
  embed.checkpointed += model.root_pre.saved;
  embed.forward_transient = std::max(embed.forward_transient, model.root_pre.forward_transient);
  embed.root_backward_transient = std::max(embed.root_backward_transient, model.root_pre.backward_transient);
  embed.workspace = std::max(embed.workspace, model.root.backward_workspace);  // the embedding's dense gradient
  add_params(head, last);
  if (pipeline.head_tied_to_embedding && num_stages > 1) {
    std::vector<PlanParam> tied;  // wte's weight, the head's too (not GPT-2's wpe)
    for (const PlanParam& p : first) {
      if (p.name.find("wte") != std::string::npos) tied.push_back(p);
    }
    add_params(head, tied);
    for (const PlanParam& p : tied) {
      const int64_t bytes = p.numel() * static_cast<int64_t>(c10::elementSize(p.dtype));
      embed.tied_bytes += bytes;
      head.tied_bytes += bytes;
    }
  }
  head.with_head = true;
  head.saved += model.root.activations.saved;
  head.checkpointed += model.root.activations.saved;  // the head is not recomputed
  head.forward_transient = std::max(head.forward_transient, model.root.activations.forward_transient);
  head.root_backward_transient = std::max(head.root_backward_transient, model.root.activations.backward_transient);
  head.workspace = std::max(head.workspace, model.root.backward_workspace);
  return stages;
}

// The rank's highest moment over its list: each stage's micro-batches held times one
// micro-batch's bytes of it, plus the gradients of the stages whose first backward of the step has
// run (zero_grad freed them; the first backward allocates them as it frees activations).
struct InFlight {
  int64_t activations = 0;
  int64_t gradients = 0;
  int microbatches = 0;
};
InFlight peak_in_flight(const std::vector<pp::Action>& actions, const std::map<int, int64_t>& bytes_of_stage,
                        const std::map<int, int64_t>& gradients_of_stage) {
  std::map<int, int> held;
  std::map<int, bool> has_gradients;
  InFlight peak;
  for (const pp::Action& a : actions) {
    if (a.kind == pp::ActionKind::Forward) ++held[a.stage];
    if (a.kind == pp::ActionKind::Backward || a.kind == pp::ActionKind::BackwardWeight) {
      --held[a.stage];
      has_gradients[a.stage] = true;
    }
    InFlight now;
    for (const auto& [stage, n] : held) {
      now.activations += n * bytes_of_stage.at(stage);
      now.microbatches += n;
      if (has_gradients[stage]) now.gradients += gradients_of_stage.at(stage);
    }
    if (now.activations + now.gradients > peak.activations + peak.gradients) peak = now;
  }
  return peak;
}

double seconds(double value, double rate) { return rate > 0 ? value / rate : 0; }

struct PipelineLayout {
  int P, V, D, T, num_stages;
  pp::Placement placement;
};

PipelineLayout layout_of(const PlanSetup& setup, const PlanPipeline& pipeline) {
  const int W = setup.world.world_size, T = std::max(1, setup.policy.tp_size), P = pipeline.pp_size;
  TORCH_CHECK(P >= 1 && W % (P * T) == 0, "pipeline plan: pp ", P, (T > 1 ? " x tp " + std::to_string(T) : ""),
              " does not divide the world size ", W, "; give a pp size dividing ", W / T);
  TORCH_CHECK(pipeline.microbatches >= 1, "pipeline plan: micro-batches must be at least 1, got ",
              pipeline.microbatches);
  const bool zbv = pipeline.schedule == pp::Schedule::ZBV;
  const int V = zbv ? 2 : pipeline.stages_per_rank;
  TORCH_CHECK(V >= 1 && (pipeline.schedule == pp::Schedule::Interleaved1F1B || zbv || V == 1),
              "pipeline plan: ", pp::to_string(pipeline.schedule), " runs one stage per rank, got ",
              pipeline.stages_per_rank, " (use interleaved 1F1B for several)");
  const ShardingStrategy strategy = setup.policy.fsdp.strategy();
  TORCH_CHECK(!is_hybrid(strategy), "pipeline plan: ", to_string(strategy), " inside a stage is not planned yet; "
              "use full, grad_op or none");
  TORCH_CHECK(!setup.policy.fsdp.cpu_offload(), "pipeline plan: cpu_offload inside a stage is not planned "
              "(Stage::fully_shard refuses it); turn it off");
  TORCH_CHECK(setup.policy.micro_batches == 1, "pipeline plan: give the micro-batches as "
              "PlanPipeline::microbatches, not PlanPolicy::micro_batches (gradient accumulation)");
  return {P, V, W / (P * T), T, P * V, pp::placement_of(pipeline.schedule)};
}

double bubble_of(const PlanPipeline& pipeline, const PipelineLayout& l) {
  const double P = l.P, M = pipeline.microbatches, V = l.V;
  if (pipeline.schedule == pp::Schedule::ZBV) return (P - 1) / (6 * M + P - 1);
  if (pipeline.schedule == pp::Schedule::Interleaved1F1B) return (P - 1) / (V * M + P - 1);
  return (P - 1) / (M + P - 1);
}

// The link between two ranks `distance` apart: within a host when both sit on one.
bool crosses_hosts(int distance, const PlanWorld& world) { return distance >= world.ranks_per_host; }

// Whether each stage runs FSDP (Stage::fully_shard): over several dp ranks, or over one where asked
// or where mixed precision or activation checkpointing needs it (the stage's unit casts and recomputes).
bool stages_sharded(const PlanPipeline& pipeline, const PlanSetup& setup, const PipelineLayout& l) {
  const FullyShardOptions& fsdp = setup.policy.fsdp;
  const bool needs_unit = fsdp.mixed_precision().param_dtype() || fsdp.mixed_precision().reduce_dtype() ||
                          fsdp.activation_checkpointing();
  return pipeline.shard_stages && (l.D > 1 || pipeline.shard_alone || needs_unit);
}

// The rank's model states and FSDP's bytes for its stages (sharded over D when stages_sharded).
void add_stage_states(PipelineRankPlan& r, const StageModel& s, const PlanSetup& setup, const PlanPipeline& pipeline,
                      const PipelineLayout& l) {
  const int64_t e = static_cast<int64_t>(c10::elementSize(setup.model.compute_dtype));
  const int64_t param_bytes = s.trainable + s.frozen > 0
                                  ? (s.trainable_bytes + s.frozen_bytes) / (s.trainable + s.frozen)
                                  : 4;
  const bool sharded = stages_sharded(pipeline, setup, l);
  const bool no_shard = setup.policy.fsdp.strategy() == ShardingStrategy::NoShard;
  r.parameters += s.trainable + s.frozen;
  if (!sharded || no_shard) {
    r.peak.sharded_params += s.trainable_bytes + s.frozen_bytes;
    r.peak.sharded_grads += s.trainable_bytes;
    r.peak.optimizer_state +=
        planning::optimizer_totals(setup.policy.optimizer, s.trainable, 0, param_bytes).state;
    if (sharded) r.all_reduce += 2 * (l.D - 1) * ceil_div(s.trainable, l.D) * param_bytes;
    return;
  }
  const int64_t shard_trainable = ceil_div(s.trainable, l.D), shard_frozen = ceil_div(s.frozen, l.D);
  r.peak.sharded_params += (shard_trainable + shard_frozen) * param_bytes;
  r.peak.optimizer_state += planning::optimizer_totals(setup.policy.optimizer, shard_trainable, 0, param_bytes).state;
  r.peak.unsharded_params += (shard_trainable + shard_frozen) * l.D * e;
  // The sum is kept in the shard's dtype ([Note: a kept gradient summed wide] in src/core/flat_param.h).
  r.peak.unsharded_grads += shard_trainable * l.D * param_bytes;
  r.all_gather += (l.D - 1) * (shard_trainable + shard_frozen) * e;
  r.reduce_scatter += (l.D - 1) * shard_trainable * param_bytes;
}

// A sharded stage's backward in a compute dtype narrower than its shards writes a fresh unsharded
// gradient in it, added into the kept sum when the backward ends, and read by the reduction
// beside the sum at the step's end ([Note: a kept gradient summed wide]).
int64_t low_precision_gradient(const StageModel& s, const PlanSetup& setup, const PlanPipeline& pipeline,
                               const PipelineLayout& l) {
  const int64_t e = static_cast<int64_t>(c10::elementSize(setup.model.compute_dtype));
  const int64_t param_bytes = s.trainable > 0 ? s.trainable_bytes / s.trainable : 4;
  const bool sharded = stages_sharded(pipeline, setup, l) && setup.policy.fsdp.strategy() != ShardingStrategy::NoShard;
  return sharded && e < param_bytes ? ceil_div(s.trainable, l.D) * l.D * e : 0;
}

PipelineRankPlan plan_rank(int pp_rank, const std::vector<StageModel>& stages, const PlanSetup& setup,
                           const PlanPipeline& pipeline, const PipelineLayout& l, int64_t whole_model_bytes) {
  PipelineRankPlan r;
  r.pp_rank = pp_rank;
  r.stages = pp::stages_of_rank(pp_rank, l.P, l.num_stages, l.placement);
  const std::vector<pp::Action> actions =
      pp::rank_actions(pipeline.schedule, l.P, l.num_stages, pipeline.microbatches, pp_rank);
  const int64_t b = setup.policy.batch;
  const int64_t M = pipeline.microbatches;
  std::map<int, int64_t> microbatch_bytes, gradients_of_stage;
  int64_t transient = 0, held_param_bytes = 0;
  const KernelRates& rates = c10::elementSize(setup.model.compute_dtype) < 4 ? setup.device.low_precision
                                                                              : setup.device.fp32;
  for (int s : r.stages) {
    const StageModel& stage = stages[static_cast<size_t>(s)];
    r.units.insert(r.units.end(), stage.names.begin(), stage.names.end());
    const int64_t gradients_before = r.peak.sharded_grads + r.peak.unsharded_grads;
    add_stage_states(r, stage, setup, pipeline, l);
    gradients_of_stage[s] = r.peak.sharded_grads + r.peak.unsharded_grads - gradients_before;
    held_param_bytes += stage.trainable_bytes + stage.frozen_bytes;
    const bool checkpointing = setup.policy.fsdp.activation_checkpointing();
    const int64_t kept = checkpointing ? stage.checkpointed : stage.saved;
    microbatch_bytes[s] = b * kept;
    r.microbatch_activations += b * kept;
    // A backward's moment: the gradient received for the stage's output, its largest transient
    // (under checkpointing on top of a unit's recomputed activations).
    const int64_t received = s + 1 < l.num_stages ? b * stage.boundary : 0;
    const int64_t recomputed = checkpointing ? b * stage.recomputed : 0;
    const int64_t gradient = stage.workspace + low_precision_gradient(stage, setup, pipeline, l);
    transient = std::max({transient, received + recomputed + b * stage.backward_transient + gradient,
                          received + b * stage.root_backward_transient + gradient, b * stage.forward_transient});
    // pp_send_bytes: each micro-batch's activation or gradient across each boundary with another rank.
    const int64_t message = M * (b * stage.boundary + kHeaderBytes);
    const int64_t in_message = s > 0 ? M * (b * stages[static_cast<size_t>(s - 1)].boundary + kHeaderBytes) : 0;
    if (s + 1 < l.num_stages && pp::rank_of_stage(s + 1, l.P, l.num_stages, l.placement) != pp_rank) {
      r.pp_send_bytes += message;
    }
    if (s > 0 && pp::rank_of_stage(s - 1, l.P, l.num_stages, l.placement) != pp_rank) r.pp_send_bytes += in_message;
    // A tie across two ranks: each sends its copy's gradient to the other ([Note: tied weights across stages]).
    const bool tie_across = pp::rank_of_stage(0, l.P, l.num_stages, l.placement) !=
                            pp::rank_of_stage(l.num_stages - 1, l.P, l.num_stages, l.placement);
    if (tie_across) r.pp_send_bytes += stage.tied_bytes;
    // A sharded stage's copy is made whole over dp first ([Note: a tie across sharded stages]).
    if (tie_across && pipeline.shard_stages && l.D > 1) r.all_reduce += 2 * (l.D - 1) * stage.tied_bytes / l.D;
    for (const PlanUnit* unit : stage.units) {
      const planning::UnitSeconds t = planning::unit_seconds(*unit, setup, rates, false);
      r.busy_s += static_cast<double>(M) * (t.forward + t.backward);
    }
    if (stage.with_head) {
      const planning::UnitSeconds t = planning::unit_seconds(setup.model.root, setup, rates, true);
      r.busy_s += static_cast<double>(M) * (t.forward + t.backward);
    }
  }
  const InFlight peak = peak_in_flight(actions, microbatch_bytes, gradients_of_stage);
  r.in_flight = peak.microbatches;
  r.peak.activations = peak.activations;
  // The gradients not yet allocated at that moment (before the stage's first backward).
  int64_t total_gradients = 0;
  for (const auto& [stage, bytes] : gradients_of_stage) total_gradients += bytes;
  const int64_t missing = total_gradients - peak.gradients;
  const int64_t from_sharded = std::min(missing, r.peak.sharded_grads);
  r.peak.sharded_grads -= from_sharded;
  r.peak.unsharded_grads -= missing - from_sharded;
  r.peak.workspace = transient;
  const int64_t batch = M * b * setup.model.input_bytes_per_sequence;  // every rank's inputs and targets
  r.peak.program = setup.model.resident_bytes + batch +
                   (pipeline.whole_model_on_every_rank ? std::max<int64_t>(0, whole_model_bytes - held_param_bytes) : 0);
  r.peak_at = "backward with " + std::to_string(r.in_flight) + " micro-batch" + (r.in_flight == 1 ? "" : "es") +
              " in flight";
  return r;
}

int64_t model_param_bytes(const PlanModel& model) {
  int64_t bytes = 0;
  auto add = [&](const PlanUnit& u) {
    for (const PlanParam& p : u.params) bytes += p.numel() * static_cast<int64_t>(c10::elementSize(p.dtype));
  };
  add(model.root);
  for (const PlanUnit& u : model.units) add(u);
  return bytes;
}

PlanTime time_of(const PipelinePlan& plan, const std::vector<StageModel>& stages, const PipelineLayout& l) {
  const PlanSetup& setup = plan.setup;
  PlanTime t;
  const PipelineRankPlan* slowest = &plan.ranks.front();
  for (const PipelineRankPlan& r : plan.ranks) {
    if (r.busy_s > slowest->busy_s) slowest = &r;
  }
  t.compute = slowest->busy_s / (1 - plan.bubble);
  // FSDP's gather at the step's start and reduction at its end; the messages of one fill and
  // drain (the rest overlap the other ranks' compute); the optimizer's pass over the shards.
  const bool dp_crosses = crosses_hosts(l.T * l.D, setup.world) && l.D > 1;
  const double dp_bandwidth = dp_crosses ? setup.links.cross_host_bandwidth : setup.links.intra_host_bandwidth;
  const double pp_bandwidth = plan.pp_crosses_hosts ? setup.links.cross_host_bandwidth : setup.links.intra_host_bandwidth;
  double fsdp = 0, messages = 0, optimizer = 0;
  const int64_t b = setup.policy.batch;
  for (const PipelineRankPlan& r : plan.ranks) {
    const double rank_fsdp = seconds(static_cast<double>(r.all_gather + r.reduce_scatter + r.all_reduce), dp_bandwidth) +
                             (l.D > 1 ? 2.0 * (l.D - 1) * setup.links.latency_s * static_cast<double>(r.stages.size()) : 0);
    fsdp = std::max(fsdp, rank_fsdp);
    const double states = static_cast<double>(r.peak.sharded_params) * 7 / 4;  // AdamW: 7 elements' worth
    optimizer = std::max(optimizer, seconds(states, setup.device.fp32.memory_bandwidth));
  }
  for (int s = 0; s + 1 < l.num_stages; ++s) {
    const double a = static_cast<double>(b * stages[static_cast<size_t>(s)].boundary + kHeaderBytes);
    messages += 2 * (seconds(a, pp_bandwidth) + setup.links.latency_s);  // forward's and backward's
  }
  t.communication = fsdp + messages;
  t.exposed_communication = fsdp + messages;
  t.compute += optimizer;
  t.step = t.compute + t.exposed_communication;
  const double tokens = static_cast<double>(plan.pipeline.microbatches) * static_cast<double>(b) * l.D *
                        static_cast<double>(setup.model.sequence_tokens);
  t.tokens_per_s = t.step > 0 ? tokens / t.step : 0;
  return t;
}

}  // namespace

int max_in_flight(const std::vector<pp::Action>& actions, int stage) {
  std::map<int, int64_t> counted, no_gradients;  // one "byte" per micro-batch of `stage`, none of the others
  for (const pp::Action& a : actions) {
    counted[a.stage] = a.stage == stage ? 1 : 0;
    no_gradients[a.stage] = 0;
  }
  return static_cast<int>(peak_in_flight(actions, counted, no_gradients).activations);
}

std::string PipelinePlan::label() const {
  std::ostringstream s;
  const std::string schedule = pipeline.schedule == pp::Schedule::GPipe            ? "gpipe"
                               : pipeline.schedule == pp::Schedule::OneFOneB        ? "1f1b"
                               : pipeline.schedule == pp::Schedule::Interleaved1F1B ? "interleaved-1f1b"
                                                                                    : "zbv";
  s << "pp " << pipeline.pp_size << " " << schedule;
  if (pipeline.schedule == pp::Schedule::Interleaved1F1B) s << " V=" << pipeline.stages_per_rank;
  s << " M=" << pipeline.microbatches << " x " << to_string(setup.policy.fsdp.strategy()) << " dp=" << dp_size;
  if (setup.policy.tp_size > 1) s << " TP=" << setup.policy.tp_size;
  if (setup.model.compute_dtype != c10::kFloat) s << " " << c10::toString(setup.model.compute_dtype);
  if (setup.policy.fsdp.activation_checkpointing()) s << " AC";
  s << " batch " << setup.policy.batch;
  return s.str();
}

PipelinePlan plan_pipeline(const PlanSetup& setup, const PlanPipeline& pipeline) {
  TORCH_CHECK(setup.model.tp_size == std::max(1, setup.policy.tp_size), "pipeline plan: the model is described "
              "for tp ", setup.model.tp_size, " and the policy asks tp ", setup.policy.tp_size,
              "; describe it for the policy's");
  const PipelineLayout l = layout_of(setup, pipeline);
  TORCH_CHECK(!pipeline.head_tied_to_embedding || !pipeline.shard_stages || l.D == 1 || l.num_stages == 1 ||
                  pp::rank_of_stage(0, l.P, l.num_stages, l.placement) !=
                      pp::rank_of_stage(l.num_stages - 1, l.P, l.num_stages, l.placement),
              "pipeline plan: ", pp::to_string(pipeline.schedule), " puts the first and the last stage on one rank, "
              "where two sharded stages cannot both hold the tied head's tensor (the pipeline refuses it)");
  PipelinePlan plan;
  plan.setup = setup;
  plan.pipeline = pipeline;
  plan.pipeline.stages_per_rank = l.V;
  plan.dp_size = l.D;
  pp::rank_actions(pipeline.schedule, l.P, l.num_stages, pipeline.microbatches, 0);  // its refusals, by name
  const std::vector<StageModel> stages = split_model(setup.model, pipeline, l.num_stages);
  const int64_t whole = model_param_bytes(setup.model);
  for (int r = 0; r < l.P; ++r) plan.ranks.push_back(plan_rank(r, stages, setup, pipeline, l, whole));
  for (const PipelineRankPlan& r : plan.ranks) {
    if (r.peak.total() > plan.peak_bytes) {
      plan.peak_bytes = r.peak.total();
      plan.peak_rank = r.pp_rank;
    }
  }
  plan.bubble = bubble_of(plan.pipeline, l);
  plan.pp_crosses_hosts = l.P > 1 && crosses_hosts(l.D * l.T, setup.world);
  plan.time = time_of(plan, stages, l);
  const double memory = setup.device.memory_bytes;
  if (memory > 0) {
    plan.headroom = 1 - static_cast<double>(plan.peak_bytes) / memory;
    plan.fits = plan.peak_bytes <= memory;
    plan.at_risk = plan.fits && plan.headroom < setup.device.allocator_reserve;
  }
  return plan;
}

}  // namespace fsdp
