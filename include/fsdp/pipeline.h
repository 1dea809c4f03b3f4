#pragma once
/// Pipeline parallelism (fsdp::pp): a LibTorch model split into stages by the names of its own
/// modules, one or several stages per rank of the pipeline's process group (the mesh dimension
/// "pp", outermost), run by a schedule that is a list of actions per rank (GPipe, 1F1B,
/// interleaved 1F1B, ZBV).
///
/// Example (2 stages; the model's forward is the chain wte -> h.0 .. h.3 -> ln_f -> head; several
/// stages per rank: [Note: V stages per rank]):
///   fsdp::DeviceMesh mesh(dist->world, {{"pp", 2}, {"dp", 1}});
///   std::vector<fsdp::pp::Part> parts{{"wte", model->wte}, {"h.0", model->blocks[0]}, ...,
///                                     {"ln_f", model->ln_f}, {"head", model->head}};
///   fsdp::pp::Stage stage(*model, parts, {{"wte", "h.0", "h.1"}, {"h.2", "h.3", "ln_f", "head"}},
///                         mesh.coordinate("pp"));
///   fsdp::pp::Pipeline pipe(std::move(stage), mesh.group_ptr("pp"), summed_cross_entropy,
///                           fsdp::pp::PipelineOptions().microbatches(4));
///   torch::optim::AdamW optim(pipe.stage().parameters(), torch::optim::AdamWOptions(1e-3));
///   for (...) { optim.zero_grad(); double loss = pipe.step(ids, targets); optim.step(); }
///
/// FSDP inside each stage (a {{"pp", P}, {"dp", D}} mesh; each dp rank passes its share of the batch):
///   stage.fully_shard(mesh.group("dp"), fsdp::FullyShardOptions());  // before building the Pipeline
///
// [Note: pipeline stages and schedules]
// A stage is a contiguous run of the model's parts. C++ cannot call an arbitrary child's forward
// (a ModuleList holds type-erased modules), so the program lists its model's forward as a chain
// of parts, each a module of the model under its own name wrapped in an AnyModule (the same
// module, not a copy); a stage runs its parts in order. The stage's names are checked against
// the model's named_modules(), so its named_parameters() are the model's own names ("h.3.attn.
// weight"), never a stage-local index: a checkpoint of a stage is keyed as the unsplit model's.
// module_fqns_per_stage is torchtitan's module_fqns_per_model_part: one list per stage; a name
// selects the part of that name and every part below it ("h" selects "h.0", "h.1", ...). Splits
// may be uneven. Where stages run is the schedule's placement ([Note: V stages per rank]).
//
// A schedule is data: schedule_actions() gives each rank's list (Unshard, Recv/Forward/Send for
// each micro-batch, Recv/Backward/Send, ReduceScatter, Reshard), which tests compare with
// hand-written lists and the runner executes in order; a planner can read the same list.
// Activations cross ranks as c10d send/recv on the pp group: the shape and dtype first (a fixed
// header), then the values, so a receiver never waits on a wrong byte count; a stage's received
// input is a leaf that requires grad, and its gradient is what the stage sends back after that
// micro-batch's backward (torch.distributed.pipelining's stage-level autograd). Sends do not
// block; receives do, up to the group's timeout, and a lost peer is named. 1F1B with fewer
// micro-batches than stages is refused by name (torchtitan#775 hangs); GPipe runs.
//
// The loss is the mean over the step's tokens, normalized once: each micro-batch's summed loss
// (the LossFn returns a sum) is divided by the step's token count before its backward, so the
// sum of the micro-batches' gradients is the unsplit model's gradient of its mean loss, and the
// step's loss (their sum) is returned on every rank (an all-reduce over the pp group, in which
// only the last stage's rank adds a loss; the same reduction carries the borrowed-weight check).
//
// FSDP inside a stage (the FSDP paper's section 7.1.1): Stage::fully_shard shards the stage over
// its dp ranks as one FSDP unit (its parts under the model's own names), and the stage's
// StageSharding runs the stage-wide actions: Unshard gathers once and holds the parameters for
// every micro-batch (their backwards add into one unsharded gradient, no_sync), ReduceScatter
// reduces that sum once after the last backward, Reshard frees them; reshard_after_microbatch
// gathers once per micro-batch instead. For an unsharded stage the actions are no-ops. What does
// not compose is refused by name ([Note: FSDP inside a stage] in src/pp/stage_sharding.cpp).
//
// [Note: V stages per rank]
// A rank may run several stages: Pipeline takes this rank's Stage objects (each built on the
// same split, its index one that stages_of_rank gives for the schedule's placement), and every
// Action names its stage. Loop placement puts stage s on rank s % P (interleaved 1F1B: rank r
// runs r, r+P, ...); V placement puts stages r and 2P-1-r on rank r (ZBV), so the last stage is
// on rank 0 beside the first. Messages are tagged per boundary and micro-batch; between two
// stages of one rank (V's turn at stages P-1, P; any P = 1) the tensor is handed over in memory
// and counts no bytes. A schedule is built as an order of computations per rank (F, B, or ZBV's
// I and W for (stage, micro-batch)) and expanded: a receive before each, a send after. ZBV's I
// is torch::autograd::grad w.r.t. the stage's input with the graph kept; its W is backward with
// the stage's weights as inputs, which frees the graph: the weights get exactly the full
// backward's gradient. Fewer micro-batches than stages: GPipe runs; 1F1B refuses (its warm-up
// would wait forever); interleaved 1F1B runs with one round of all M micro-batches when M < P,
// and refuses an M > P that does not split into floor(M/P) equal rounds; ZBV runs (its order for
// 2P-1 micro-batches with the ones past M left out). The schedule tests run every list as the
// runner does to check that none waits forever.
//
// [Note: tied weights across stages]
// GPT-2's head weight is its embedding's tensor, registered under both names; with the first
// and last stage on different ranks each rank's copy is trained by its own stage. Ties are found,
// not declared: a Stage compares the model's parameters by tensor (TiedParameter lists every
// name and the stages holding it), so a tie the user forgot cannot train silently wrong. The
// pipeline makes every copy equal at construction (the first holding stage's values), and after
// each step's last backward replaces each copy's gradient by the sum of every holding rank's
// (point-to-point, added in rank order, so the sums and the values after the optimizer step stay
// bitwise equal). A tie inside one rank is one tensor (autograd sums it; parameters() gives it
// once). A weight tied only in forward (the head calling F::linear(x, wte->weight) without
// registering it) leaves no trace in the parameters: the step then sees a tensor that no local
// stage holds gain a gradient and every rank throws, naming it on the rank that found it.
// With FSDP inside the stages, the sum runs on the stages' reduced gradient shards, each made
// whole over its dp ranks first ([Note: a tie across sharded stages] in src/pp/tied_weights.cpp);
// two sharded stages of one rank holding one tie are refused by name.

#include <fsdp/distributed.h>
#include <fsdp/options.h>
#include <fsdp/sharded_model.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/ordered_dict.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::pp {

/// One link of the model's forward chain: a module of the model, by its name in the model.
struct Part {
  std::string name;
  torch::nn::AnyModule module;
};

/// Where stages sit on the pp ranks ([Note: V stages per rank]). Loop: stage s on rank s % P
/// (GPipe, 1F1B: V = 1; interleaved 1F1B: V >= 1). V: rank r holds stages r and 2P-1-r (ZBV).
enum class Placement { Loop, V };

/// The stages on pp rank `rank` of `num_stages` over `pp_size` ranks, in increasing order. Throws
/// unless the stages divide evenly over the ranks (V placement: exactly two per rank).
std::vector<int> stages_of_rank(int rank, int pp_size, int num_stages, Placement placement = Placement::Loop);
/// The pp rank that runs `stage`.
int rank_of_stage(int stage, int pp_size, int num_stages, Placement placement = Placement::Loop);

/// A parameter of a stage that is the same tensor as a parameter of another stage (GPT-2's wte.weight
/// and head.weight): found from the model, not declared ([Note: tied weights across stages]).
struct TiedParameter {
  std::string name;                ///< this stage's name for it
  std::vector<std::string> names;  ///< every name of the tensor in the model, in the model's order
  std::vector<int> stages;         ///< the stages holding one of those names, increasing
};

class StageSharding;
class ShardedStage;

/// Stage `index` of `model`: the parts named by module_fqns_per_stage[index].
class Stage {
 public:
  /// `parts` is the model's forward chain, in order; module_fqns_per_stage has one list per stage
  /// and together they select every part once, in the chain's order. Throws naming the name that
  /// is not one of the model's modules, selects no part, or breaks the order.
  Stage(torch::nn::Module& model, std::vector<Part> parts,
        const std::vector<std::vector<std::string>>& module_fqns_per_stage, int index);

  int index() const { return index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ + 1 == num_stages_; }
  /// The names of this stage's parts, in order.
  std::vector<std::string> part_names() const;
  /// Runs this stage's parts on `x`.
  torch::Tensor forward(torch::Tensor x);
  /// This stage's parameters under the model's own names.
  torch::OrderedDict<std::string, torch::Tensor> named_parameters() const { return named_parameters_; }
  /// Each tensor once (a weight tied inside the stage is registered under two names).
  std::vector<torch::Tensor> parameters() const;
  /// This stage's parameters that other stages hold too (tied weights).
  const std::vector<TiedParameter>& tied_parameters() const { return tied_; }
  /// The model's parameters that no part of this stage holds: a stage whose backward reaches one
  /// used another stage's weight without holding it (refused after the step, by name).
  const torch::OrderedDict<std::string, torch::Tensor>& other_stages_parameters() const { return others_; }

  /// FSDP inside the stage: shards its parameters over `dp`, the stage's data-parallel ranks
  /// (mesh.group("dp")), as one FSDP unit that the pipeline gathers once per step and whose
  /// gradients it reduces once per step ([Note: FSDP inside a stage]). Every rank of `dp` calls it
  /// (a collective). Between steps the parameters (the same tensors, under the same names) are
  /// this rank's 1-D shards, as after fsdp::fully_shard. Strategies: all; mixed precision: yes
  /// (the held gradient summed in fp32: [Note: a kept gradient summed wide] in core/flat_param.cpp);
  /// activation_checkpointing: each part recomputed in backward (not with ZBV). Throws, naming the
  /// option and the fix, for cpu_offload, reshard_after_forward, a part held by an fsdp::Unit, or
  /// a stage sharded twice.
  void fully_shard(ProcessGroup& dp, FullyShardOptions options = {});
  bool is_sharded() const { return sharded_ != nullptr; }
  /// The stage's sharded model (gather_full_params, checkpoints, clipping); throws unless sharded.
  ShardedModel sharded_model() const;
  /// What the schedule's Unshard, ReduceScatter and Reshard do for this stage (nothing unless sharded).
  std::shared_ptr<StageSharding> sharding() const;

 private:
  int index_;
  int num_stages_;
  std::vector<Part> parts_;  // this stage's
  torch::OrderedDict<std::string, torch::Tensor> named_parameters_;
  std::vector<TiedParameter> tied_;
  torch::OrderedDict<std::string, torch::Tensor> others_;
  std::shared_ptr<ShardedStage> sharded_;  // set by fully_shard
};

enum class ActionKind {
  Unshard,         ///< gather the stage's parameters (FSDP), kept for all its micro-batches
  RecvActivation,  ///< the micro-batch's input from the previous stage
  Forward,
  SendActivation,  ///< the micro-batch's output to the next stage
  RecvGradient,    ///< the gradient of the micro-batch's output from the next stage
  Backward,
  BackwardInput,   ///< the gradient of the micro-batch's input only (ZBV's I), graph kept
  BackwardWeight,  ///< the gradient of the stage's weights for that micro-batch (ZBV's W)
  SendGradient,    ///< the gradient of the micro-batch's input to the previous stage
  ReduceScatter,   ///< the stage's summed gradients, once, after its last backward (FSDP)
  Reshard,         ///< free the gathered parameters (FSDP)
};

struct Action {
  ActionKind kind;
  int microbatch = -1;  ///< -1 for the stage-wide actions (Unshard, ReduceScatter, Reshard)
  int stage = 0;
  bool operator==(const Action& other) const {
    return kind == other.kind && microbatch == other.microbatch && stage == other.stage;
  }
};

/// GPipe and 1F1B: one stage per rank. Interleaved1F1B (Megatron, torch's ScheduleInterleaved1F1B):
/// V >= 1 stages per rank, loop placement. ZBV (torch's ScheduleZBVZeroBubble): two stages per
/// rank, V placement, the backward split into input (BackwardInput) and weight (BackwardWeight).
enum class Schedule { GPipe, OneFOneB, Interleaved1F1B, ZBV };

/// Where `schedule` puts its stages.
Placement placement_of(Schedule schedule);

/// The actions of `stage` of `num_stages` for `microbatches` micro-batches, in the order they
/// run, for the one-stage-per-rank schedules (GPipe, 1F1B; rank_actions gives every schedule's).
/// Throws for 1F1B with fewer micro-batches than stages, naming the fix.
std::vector<Action> schedule_actions(Schedule schedule, int num_stages, int microbatches, int stage);
/// The actions of pp rank `rank` of `pp_size` (all its stages') for `microbatches` micro-batches,
/// in the order they run. Throws for a count of stages the schedule cannot place or a count of
/// micro-batches it refuses, naming the fix ([Note: V stages per rank]).
std::vector<Action> rank_actions(Schedule schedule, int pp_size, int num_stages, int microbatches, int rank);
/// "UNSHARD F0 SA0 F1 SA1 RG0 B0 ..." (RA/SA/RG/SG: recv/send activation/gradient; I/W: backward
/// input/weight). A list of several stages prefixes each action with its stage: "2F0".
std::string to_string(const std::vector<Action>& actions);
std::string to_string(Schedule schedule);

/// What FSDP does inside a stage at its stage-wide actions; the default does nothing (the stage
/// is not sharded).
class StageSharding {
 public:
  virtual ~StageSharding() = default;
  virtual void unshard() {}
  virtual void reduce_scatter() {}
  virtual void reshard() {}
};

/// A micro-batch's loss summed over its tokens (reduction sum): the pipeline divides by the step's
/// token count.
using LossFn = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

struct PipelineOptions {
  TORCH_ARG(Schedule, schedule) = Schedule::OneFOneB;
  /// The step's batch (dim 0) is split into this many equal micro-batches.
  TORCH_ARG(int, microbatches) = 1;
  /// A sharded stage (Stage::fully_shard) frees its gathered parameters after every micro-batch's
  /// backward and gathers them again before its next forward or backward: M all-gathers a step
  /// instead of one, for the memory of the unsharded parameters between micro-batches. The
  /// gradients are still reduced once, after the last backward.
  TORCH_ARG(bool, reshard_after_microbatch) = false;
};

class TiedWeights;
class BorrowedWeights;

/// Runs this rank's stages in their schedule, one step at a time.
class Pipeline {
 public:
  /// `pp`: the pipeline's group (stage s on member s). Checks the schedule for this size now.
  /// `sharding`: the stage's own (Stage::sharding()) unless given; not both.
  Pipeline(Stage stage, std::shared_ptr<ProcessGroup> pp, LossFn loss_sum, PipelineOptions options = {},
           std::shared_ptr<StageSharding> sharding = nullptr);
  /// This rank's stages (stages_of_rank for the schedule's placement, any order), several for
  /// interleaved 1F1B and ZBV; throws naming the stages the schedule puts here if they differ.
  /// Tied weights held on several ranks are made equal now (the first holding stage's values: the
  /// ranks holding a tie construct their Pipelines together) and have their gradients summed
  /// over those ranks after each step.
  Pipeline(std::vector<Stage> stages, std::shared_ptr<ProcessGroup> pp, LossFn loss_sum,
           PipelineOptions options = {}, std::shared_ptr<StageSharding> sharding = nullptr);

  /// One forward and backward of the step's batch: `inputs` are read on the first stage,
  /// `targets` on the last (every rank may pass both). Gradients are accumulated into the stage's
  /// parameters (zero them before, step after); a tied weight's is the sum over the stages holding
  /// it. Returns the step's loss, the mean over its tokens (targets.numel()), on every rank. Every
  /// rank throws if a stage used a weight it does not hold ([Note: tied weights across stages]).
  /// With a sharded stage each dp rank passes an equal share of the global batch: the gradients
  /// are the global batch's (the dp reduction averages the ranks' means), and the loss returned is
  /// this rank's share's mean (average it over "dp" for the global one).
  double step(const torch::Tensor& inputs, const torch::Tensor& targets);
  /// step() with each micro-batch's summed loss divided by `loss_tokens` rather than
  /// targets.numel(): gradient accumulation over whole schedules. Call it A times without zeroing
  /// the gradients, each with the tokens of all A calls (on a sharded stage, this dp rank's), and
  /// step the optimizer once: the gradients add (a sharded stage adds each call's reduction into
  /// its gradient shard; a weight tied across stages has each call's sum over its holders added
  /// to what it kept), so they are the gradient of the mean over all A calls' tokens, normalized
  /// once. Returns this call's share of that mean (its summed loss over `loss_tokens`): the A
  /// returns add up to the mean.
  double step(const torch::Tensor& inputs, const torch::Tensor& targets, int64_t loss_tokens);
  /// A forward-only pass of the batch through the stages (evaluation): no autograd graph, no
  /// gradient, no reduction; a sharded stage gathered once before its first micro-batch and freed
  /// after its last, as in a step. Split into `microbatches` (0: the pipeline's count), each run
  /// through this rank's stages in increasing order (a receive waits only on an earlier
  /// micro-batch or stage: no placement deadlocks; [Note: a pipeline's evaluation] in
  /// src/pp/pipeline_evaluate.cpp). Returns the mean loss over targets.numel() tokens, on every
  /// rank of the pp group (on a sharded stage, this dp rank's batch's: give every dp rank the same
  /// batch for the same number). A collective over the pp group and each sharded stage's dp group.
  double evaluate(const torch::Tensor& inputs, const torch::Tensor& targets, int microbatches = 0);

  /// This rank's only stage (throws when it runs several: stages()).
  Stage& stage();
  /// This rank's stages, in increasing index.
  std::vector<Stage>& stages() { return stages_; }
  /// Every parameter of this rank's stages once (a weight tied across two local stages is one
  /// tensor): what the optimizer takes.
  std::vector<torch::Tensor> parameters() const;
  const std::vector<Action>& actions() const { return actions_; }
  /// The pipeline's group (stage s's rank is member rank_of_stage(s)).
  ProcessGroup& group() const { return *pp_; }

 private:
  std::vector<Stage> stages_;
  std::shared_ptr<ProcessGroup> pp_;
  LossFn loss_sum_;
  PipelineOptions options_;
  std::vector<std::shared_ptr<StageSharding>> shardings_;  // each stage's, in stages_' order
  std::vector<Action> actions_;
  std::vector<int> rank_of_;  // the pp rank of each stage
  std::shared_ptr<TiedWeights> tied_;
  std::shared_ptr<BorrowedWeights> borrowed_;
  std::shared_ptr<const void> stage_marks_;  // marks the stages' parameters as a pipeline's while alive
};

/// torch::nn::utils::clip_grad_norm_ for a pipelined model: scales every stage's gradients so
/// that the global L2 norm (the unsplit model's: each element once, over every stage, a sharded
/// stage's pieces summed over its dp ranks, a weight tied across stages counted once) is at most
/// `max_norm`, and returns the norm before clipping. LibTorch's clip sees one stage alone and
/// clips each pp rank by its own norm; fsdp::clip_grad_norm_ given a parameter of a live
/// Pipeline of several stages refuses, naming this function. A
/// collective over the pipeline's group (and each sharded stage's dp group): every rank calls it,
/// after step() and before the optimizer step.
///
/// Example:
///   double loss = pipe.step(inputs, targets);
///   double norm = fsdp::pp::clip_grad_norm_(pipe, 1.0);
///   optimizer.step();
double clip_grad_norm_(Pipeline& pipeline, double max_norm);

}  // namespace fsdp::pp
