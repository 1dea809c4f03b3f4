#pragma once
/// Pipeline parallelism (fsdp::pp): a LibTorch model split into stages by the names of its own
/// modules, one stage per rank of the pipeline's process group (the mesh dimension "pp",
/// outermost), run by a schedule that is a list of actions per rank (GPipe, 1F1B).
///
/// Example (2 stages; the model's forward is the chain wte -> h.0 .. h.3 -> ln_f -> head):
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
// may be uneven. Placement is "loop": stage s on pp rank s. V stages per rank (interleaved 1F1B,
// ZBV) would give a rank several Stage objects: the Action already carries its stage index and
// stages_of_rank() is the one place that maps ranks to stages; neither is built beyond V = 1.
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
// step's loss (their sum) is returned on every rank (broadcast from the last stage).
//
// FSDP inside a stage (the FSDP paper's section 7.1.1): Stage::fully_shard shards the stage over
// its dp ranks as one FSDP unit (its parts under the model's own names), and the stage's
// StageSharding runs the stage-wide actions: Unshard gathers once and holds the parameters for
// every micro-batch (their backwards add into one unsharded gradient, no_sync), ReduceScatter
// reduces that sum once after the last backward, Reshard frees them; reshard_after_microbatch
// gathers once per micro-batch instead. For an unsharded stage the actions are no-ops. What does
// not compose is refused by name ([Note: FSDP inside a stage] in src/pp/stage_sharding.cpp).

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

/// The stages on pp rank `rank` of `num_stages` over `pp_size` ranks ("loop" placement: V = 1,
/// stage s on rank s). The extension point for V stages per rank.
std::vector<int> stages_of_rank(int rank, int pp_size, int num_stages);

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
  std::vector<torch::Tensor> parameters() const { return named_parameters_.values(); }

  /// FSDP inside the stage: shards its parameters over `dp`, the stage's data-parallel ranks
  /// (mesh.group("dp")), as one FSDP unit that the pipeline gathers once per step and whose
  /// gradients it reduces once per step ([Note: FSDP inside a stage]). Every rank of `dp` calls it
  /// (a collective). Between steps the parameters (the same tensors, under the same names) are
  /// this rank's 1-D shards, as after fsdp::fully_shard. Strategies: all; mixed precision: yes.
  /// Throws, naming the option and the fix, for activation_checkpointing, cpu_offload,
  /// reshard_after_forward, a part held by an fsdp::Unit, or a stage sharded twice.
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
  std::shared_ptr<ShardedStage> sharded_;  // set by fully_shard
};

enum class ActionKind {
  Unshard,         ///< gather the stage's parameters (FSDP), kept for all its micro-batches
  RecvActivation,  ///< the micro-batch's input from the previous stage
  Forward,
  SendActivation,  ///< the micro-batch's output to the next stage
  RecvGradient,    ///< the gradient of the micro-batch's output from the next stage
  Backward,
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

enum class Schedule { GPipe, OneFOneB };

/// The actions of `stage` of `num_stages` for `microbatches` micro-batches, in the order they
/// run. Throws for 1F1B with fewer micro-batches than stages, naming the fix.
std::vector<Action> schedule_actions(Schedule schedule, int num_stages, int microbatches, int stage);
/// "UNSHARD F0 SA0 F1 SA1 RG0 B0 ..." (RA/SA/RG/SG: recv/send activation/gradient).
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

/// Runs this rank's stage in its schedule, one step at a time.
class Pipeline {
 public:
  /// `pp`: the pipeline's group (stage s on member s). Checks the schedule for this size now.
  /// `sharding`: the stage's own (Stage::sharding()) unless given; not both.
  Pipeline(Stage stage, std::shared_ptr<ProcessGroup> pp, LossFn loss_sum, PipelineOptions options = {},
           std::shared_ptr<StageSharding> sharding = nullptr);

  /// One forward and backward of the step's batch: `inputs` are read on the first stage,
  /// `targets` on the last (every rank may pass both). Gradients are accumulated into the stage's
  /// parameters (zero them before, step after). Returns the step's loss, the mean over its
  /// tokens (targets.numel()), on every rank. With a sharded stage each dp rank passes an equal
  /// share of the global batch: the gradients are the global batch's (the dp reduction averages
  /// the ranks' means), and the loss returned is this rank's share's mean (average it over "dp"
  /// for the global one).
  double step(const torch::Tensor& inputs, const torch::Tensor& targets);

  Stage& stage() { return stage_; }
  const std::vector<Action>& actions() const { return actions_; }

 private:
  Stage stage_;
  std::shared_ptr<ProcessGroup> pp_;
  LossFn loss_sum_;
  PipelineOptions options_;
  std::shared_ptr<StageSharding> sharding_;
  std::vector<Action> actions_;
};

}  // namespace fsdp::pp
