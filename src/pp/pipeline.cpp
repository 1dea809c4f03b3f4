// The runner: executes this rank's list of actions for one step, over one stage or several
// ([Note: pipeline stages and schedules], [Note: V stages per rank]).
#include <fsdp/pipeline.h>

#include "core/stage_marks.h"
#include "pp/borrowed_weights.h"
#include "pp/stage_messages.h"
#include "pp/stage_sharding.h"
#include "pp/tied_weights.h"
#include "tp/tied_backward_scope.h"
#include "util/trace.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::pp {

namespace {

// An action's span in a --trace: "<what> stage S mb M"; a receive is a wait on another stage.
const char* span_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Unshard: return "pp unshard";
    case ActionKind::ReduceScatter: return "pp reduce_scatter";
    case ActionKind::Reshard: return "pp reshard";
    case ActionKind::RecvActivation: return "pp recv_activation";
    case ActionKind::Forward: return "pp forward";
    case ActionKind::SendActivation: return "pp send_activation";
    case ActionKind::RecvGradient: return "pp recv_gradient";
    case ActionKind::Backward: return "pp backward";
    case ActionKind::BackwardInput: return "pp backward_input";
    case ActionKind::BackwardWeight: return "pp backward_weight";
    case ActionKind::SendGradient: return "pp send_gradient";
  }
  return "pp action";
}

TraceLane span_lane(ActionKind kind) {
  switch (kind) {
    case ActionKind::RecvActivation:
    case ActionKind::RecvGradient: return TraceLane::Waits;
    case ActionKind::SendActivation:
    case ActionKind::SendGradient:
    case ActionKind::Unshard:
    case ActionKind::ReduceScatter: return TraceLane::Communication;
    default: return TraceLane::Compute;
  }
}

std::string span_label(const Action& a) {
  if (!trace_enabled()) return {};
  return "stage " + std::to_string(a.stage) + (a.microbatch >= 0 ? " mb " + std::to_string(a.microbatch) : "");
}

std::vector<at::Tensor> split_batch(const at::Tensor& batch, int microbatches, const char* what) {
  TORCH_CHECK(batch.defined() && batch.dim() >= 1 && batch.size(0) % microbatches == 0, "pipeline: the step's ",
              what, " (", batch.defined() ? batch.sizes().vec() : std::vector<int64_t>{},
              ") do not split along dim 0 into ", microbatches,
              " equal micro-batches; give a batch whose first size is a multiple of the micro-batch count");
  return batch.chunk(microbatches, 0);
}

// What one step keeps of each micro-batch on each stage between its forward and its backward.
struct MicroBatchState {
  at::Tensor input;       // the stage's input (a leaf that requires grad, past the first stage)
  at::Tensor output;      // the stage's output (the scaled loss on the last stage)
  at::Tensor grad;        // the gradient of the output, from the next stage
  at::Tensor input_grad;  // the input's gradient, when computed apart from the weights' (ZBV's I)
};

// One step's state on this rank, and what each action does to it.
class StepRun {
 public:
  StepRun(std::vector<Stage>& stages, const std::vector<std::shared_ptr<StageSharding>>& shardings,
          std::vector<int> rank_of, ProcessGroup& pp, const LossFn& loss_sum, const PipelineOptions& options)
      : loss_sum_(loss_sum),
        reshard_after_microbatch_(options.reshard_after_microbatch()),
        messages_(pp, std::move(rank_of), options.microbatches()) {
    for (size_t i = 0; i < stages.size(); ++i) {
      stages_[stages[i].index()] = &stages[i];
      shardings_[stages[i].index()] = shardings[i].get();
      mbs_[stages[i].index()].resize(static_cast<size_t>(options.microbatches()));
    }
  }

  // `loss_tokens`: what each micro-batch's summed loss is divided by (0: targets.numel()).
  void set_batch(const at::Tensor& inputs, const at::Tensor& targets, int microbatches, int64_t loss_tokens) {
    if (stages_.begin()->second->is_first()) inputs_ = split_batch(inputs, microbatches, "inputs");
    if (stages_.rbegin()->second->is_last()) {
      targets_ = split_batch(targets, microbatches, "targets");
      tokens_ = loss_tokens > 0 ? loss_tokens : targets.numel();
    }
  }

  void run(const Action& a) {
    StageSharding& sharding = *shardings_.at(a.stage);
    const bool computes = a.kind == ActionKind::Forward || a.kind == ActionKind::Backward ||
                          a.kind == ActionKind::BackwardInput || a.kind == ActionKind::BackwardWeight;
    if (reshard_after_microbatch_ && computes) sharding.unshard();  // gathered again, if resharded
    const std::string label = span_label(a);
    {
      TraceSpan span(span_name(a.kind), label, span_lane(a.kind));
      run_action(a, sharding);
    }
    // A micro-batch's backward ends with B, or with ZBV's W (its I keeps the graph for W).
    const bool ends_backward = a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight;
    if (reshard_after_microbatch_ && ends_backward) sharding.reshard();
  }

  void run_action(const Action& a, StageSharding& sharding) {
    Stage& stage = *stages_.at(a.stage);
    MicroBatchState* mb = a.microbatch >= 0 ? &mbs_.at(a.stage).at(static_cast<size_t>(a.microbatch)) : nullptr;
    switch (a.kind) {
      case ActionKind::Unshard: return sharding.unshard();
      case ActionKind::ReduceScatter: return sharding.reduce_scatter();
      case ActionKind::Reshard: return sharding.reshard();
      case ActionKind::RecvActivation: return recv_activation(stage, *mb, a.microbatch);
      case ActionKind::Forward: return forward(stage, *mb, a.microbatch);
      case ActionKind::SendActivation:
        return messages_.send_activation(stage.index(), a.microbatch, mb->output.detach());
      case ActionKind::RecvGradient: return recv_gradient(stage, *mb, a.microbatch);
      case ActionKind::Backward: return backward(stage, *mb);
      case ActionKind::BackwardInput: return backward_input(*mb);
      case ActionKind::BackwardWeight: return backward_weight(stage, *mb);
      case ActionKind::SendGradient: return send_gradient(stage, *mb, a.microbatch);
    }
  }

  // Every message has left; the step's loss sum (the last stage's; 0 on other ranks).
  double finish() {
    messages_.finish();
    return loss_sum_of_step_;
  }

 private:
  void recv_activation(Stage& stage, MicroBatchState& mb, int index) {
    at::Tensor input = messages_.recv_activation(stage.index(), index).to(device(stage));
    mb.input = at::isFloatingType(input.scalar_type()) ? input.requires_grad_(true) : input;
  }

  void forward(Stage& stage, MicroBatchState& mb, int index) {
    if (stage.is_first()) mb.input = inputs_.at(static_cast<size_t>(index)).to(device(stage));
    mb.output = stage.forward(mb.input);
    if (!stage.is_last()) return;
    // The mean over the step's tokens, normalized once: this micro-batch's sum over the step's count.
    at::Tensor summed = loss_sum_(mb.output, targets_.at(static_cast<size_t>(index)).to(device(stage)));
    TORCH_CHECK(summed.numel() == 1, "pipeline: the loss function returned ", summed.sizes(),
                "; it must return the micro-batch's loss summed over its tokens (one number)");
    mb.output = summed / static_cast<double>(tokens_);
    loss_sum_of_step_ += mb.output.item<double>();
  }

  void recv_gradient(Stage& stage, MicroBatchState& mb, int index) {
    mb.grad = messages_.recv_gradient(stage.index(), index).to(device(stage));
    TORCH_CHECK(mb.grad.sizes() == mb.output.sizes(), "pipeline: stage ", stage.index() + 1,
                " sent a gradient of shape ", mb.grad.sizes(), " for micro-batch ", index, "'s output of shape ",
                mb.output.sizes(), "; the stages disagree on the model or the micro-batches");
  }

  // The output's gradient (none for the last stage's loss: d loss / d loss = 1).
  static std::vector<at::Tensor> output_grads(const MicroBatchState& mb) {
    return mb.grad.defined() ? std::vector<at::Tensor>{mb.grad} : std::vector<at::Tensor>{};
  }

  void backward(const Stage& stage, MicroBatchState& mb) {
    std::optional<tp::detail::TiedBackwardScope> tied;  // [Note: a tied weight's second backward]
    if (!stage.tied_parameters().empty()) tied.emplace();
    // A first stage whose parameters are all frozen: nothing before it, nothing to compute.
    if (mb.output.requires_grad()) torch::autograd::backward({mb.output}, output_grads(mb));
    mb.output = at::Tensor();
    mb.grad = at::Tensor();
  }

  // ZBV's I: the input's gradient alone, the graph kept for the weights' (W). The first stage's
  // input (token ids) has none: its W runs the whole backward.
  void backward_input(MicroBatchState& mb) {
    if (!mb.input.requires_grad()) return;
    mb.input_grad = torch::autograd::grad({mb.output}, {mb.input}, output_grads(mb), /*retain_graph=*/true,
                                          /*create_graph=*/false, /*allow_unused=*/true)[0];
  }

  // ZBV's W: the weights' gradients of the same micro-batch, accumulated into them; the graph freed.
  void backward_weight(Stage& stage, MicroBatchState& mb) {
    std::vector<at::Tensor> weights;
    for (const at::Tensor& p : stage.parameters()) {
      if (p.requires_grad()) weights.push_back(p);
    }
    std::optional<tp::detail::TiedBackwardScope> tied;  // [Note: a tied weight's second backward]
    if (!stage.tied_parameters().empty()) tied.emplace();
    if (!weights.empty()) {
      torch::autograd::backward({mb.output}, output_grads(mb), /*retain_graph=*/false, /*create_graph=*/false,
                                weights);
    }
    mb.output = at::Tensor();
    mb.grad = at::Tensor();
  }

  void send_gradient(Stage& stage, MicroBatchState& mb, int index) {
    at::Tensor grad = mb.input_grad.defined() ? mb.input_grad
                      : mb.input.requires_grad() && mb.input.grad().defined() ? mb.input.grad()
                                                                                : at::zeros_like(mb.input);
    messages_.send_gradient(stage.index(), index, grad);
    mb.input = at::Tensor();
    mb.input_grad = at::Tensor();
  }

  static c10::Device device(const Stage& stage) {
    const auto params = stage.parameters();
    return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  }

  const LossFn& loss_sum_;
  bool reshard_after_microbatch_;
  StageMessages messages_;
  std::map<int, Stage*> stages_;                        // this rank's, by index
  std::map<int, StageSharding*> shardings_;             // each stage's, by index
  std::map<int, std::vector<MicroBatchState>> mbs_;  // by stage index, then micro-batch
  std::vector<at::Tensor> inputs_, targets_;
  int64_t tokens_ = 0;
  double loss_sum_of_step_ = 0;
};

std::vector<Stage> one_stage(Stage stage) {
  std::vector<Stage> out;
  out.push_back(std::move(stage));
  return out;
}

std::string indices_of(const std::vector<int>& stages) {
  std::string out;
  for (int s : stages) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return "{" + out + "}";
}

// This rank's stages must be the ones the schedule's placement puts here, built on one split.
void check_stages(std::vector<Stage>& stages, const ProcessGroup& pp, Schedule schedule) {
  TORCH_CHECK(!stages.empty(), "pipeline: no stage; give this rank's stages (stages_of_rank)");
  std::sort(stages.begin(), stages.end(), [](const Stage& a, const Stage& b) { return a.index() < b.index(); });
  const int num_stages = stages.front().num_stages();
  std::vector<int> given;
  for (const Stage& stage : stages) {
    TORCH_CHECK(stage.num_stages() == num_stages, "pipeline: this rank's stages come from splits into ",
                num_stages, " and ", stage.num_stages(), " stages; build them from one module_fqns_per_stage");
    given.push_back(stage.index());
  }
  const std::vector<int> expected = stages_of_rank(pp.rank(), pp.size(), num_stages, placement_of(schedule));
  TORCH_CHECK(given == expected, "pipeline: pp rank ", pp.rank(), " was given stages ", indices_of(given),
              " of ", num_stages, "; schedule ", to_string(schedule), " puts stages ", indices_of(expected),
              " here: build them with fsdp::pp::stages_of_rank(mesh.coordinate(\"pp\"), pp size, ", num_stages,
              ", fsdp::pp::placement_of(schedule))");
}

// The stage's own sharding (Stage::fully_shard) or the one given, not both.
std::shared_ptr<StageSharding> sharding_of(const Stage& stage, std::shared_ptr<StageSharding> given,
                                           const PipelineOptions& options) {
  TORCH_CHECK(!(given && stage.is_sharded()), "pipeline: stage ", stage.index(), " is sharded (Stage::fully_shard) ",
              "and a StageSharding was given too; give neither, the stage's own is used");
  TORCH_CHECK(!options.reshard_after_microbatch() || given || stage.is_sharded(), "pipeline: ",
              "PipelineOptions::reshard_after_microbatch(true) on stage ", stage.index(), ", which is not sharded: ",
              "there is nothing to reshard; call Stage::fully_shard(mesh.group(\"dp\")) first, or leave it off");
  return given ? std::move(given) : stage.sharding();
}

// FSDP inside stages with what does not compose beside it, refused by name (a tie held by two
// sharded stages of one rank: TiedWeights).
void check_sharded_stages_compose(const std::vector<Stage>& stages, Schedule schedule) {
  for (const Stage& stage : stages) {
    if (!stage.is_sharded()) continue;
    const auto* sharded = dynamic_cast<const ShardedStage*>(stage.sharding().get());
    TORCH_CHECK(schedule != Schedule::ZBV || !sharded || !sharded->recomputes_parts(), "pipeline: stage ",
                stage.index(), " recomputes its parts in backward (FullyShardOptions::activation_checkpointing) "
                "and the schedule is ZBV: its input-gradient pass would run the recomputation's backward, which "
                "accumulates the weights' gradients too, before its weight pass adds them again ([Note: activation "
                "checkpointing inside a stage]); use Interleaved1F1B, OneFOneB or GPipe, or turn "
                "activation_checkpointing off");
  }
}

// [Note: calls that see one stage] (core/stage_marks.cpp): this rank's stages' parameters, each
// under its name and stage, while the pipeline lives.
std::shared_ptr<const void> mark_stages(const std::vector<Stage>& stages) {
  std::vector<at::Tensor> params;
  std::vector<detail::StageMark> marks;
  for (const Stage& stage : stages) {
    const std::string where = "stage " + std::to_string(stage.index()) + " of " + std::to_string(stage.num_stages());
    for (const auto& item : stage.named_parameters()) {
      params.push_back(item.value());
      marks.push_back({item.key(), where});
    }
  }
  return detail::mark_stage_parameters(params, marks);
}

}  // namespace

Pipeline::Pipeline(Stage stage, std::shared_ptr<ProcessGroup> pp, LossFn loss_sum, PipelineOptions options,
                   std::shared_ptr<StageSharding> sharding)
    : Pipeline(one_stage(std::move(stage)), std::move(pp), std::move(loss_sum), options, std::move(sharding)) {}

Pipeline::Pipeline(std::vector<Stage> stages, std::shared_ptr<ProcessGroup> pp, LossFn loss_sum,
                   PipelineOptions options, std::shared_ptr<StageSharding> sharding)
    : stages_(std::move(stages)),
      pp_(std::move(pp)),
      loss_sum_(std::move(loss_sum)),
      options_(options) {
  TORCH_CHECK(pp_, "pipeline: no pp process group (give mesh.group_ptr(\"pp\"))");
  TORCH_CHECK(loss_sum_, "pipeline: no loss function (a micro-batch's loss summed over its tokens)");
  check_stages(stages_, *pp_, options_.schedule());
  for (const Stage& stage : stages_) shardings_.push_back(sharding_of(stage, sharding, options_));
  check_sharded_stages_compose(stages_, options_.schedule());
  const int num_stages = stages_.front().num_stages();
  actions_ = rank_actions(options_.schedule(), pp_->size(), num_stages, options_.microbatches(), pp_->rank());
  for (int s = 0; s < num_stages; ++s) {
    rank_of_.push_back(rank_of_stage(s, pp_->size(), num_stages, placement_of(options_.schedule())));
  }
  tied_ = std::make_shared<TiedWeights>(stages_, rank_of_, pp_->rank());
  tied_->make_equal(*pp_);
  borrowed_ = std::make_shared<BorrowedWeights>(stages_);
  if (num_stages > 1) stage_marks_ = mark_stages(stages_);
}

Stage& Pipeline::stage() {
  TORCH_CHECK(stages_.size() == 1, "pipeline: this rank runs ", stages_.size(), " stages; use stages()");
  return stages_.front();
}

std::vector<torch::Tensor> Pipeline::parameters() const {
  std::vector<torch::Tensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (const Stage& stage : stages_) {
    for (const torch::Tensor& p : stage.parameters()) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  }
  return out;
}

double Pipeline::step(const torch::Tensor& inputs, const torch::Tensor& targets) {
  return step(inputs, targets, 0);
}

double Pipeline::step(const torch::Tensor& inputs, const torch::Tensor& targets, int64_t loss_tokens) {
  TORCH_CHECK(loss_tokens >= 0, "pipeline: step's loss_tokens is ", loss_tokens, "; give the tokens of every "
              "step accumulated before the optimizer step (or 0 for this step's targets.numel())");
  borrowed_->before_step();
  tied_->set_aside_gradients();  // [Note: a tied weight's gradient accumulated over steps]
  StepRun run(stages_, shardings_, rank_of_, *pp_, loss_sum_, options_);
  run.set_batch(inputs, targets, options_.microbatches(), loss_tokens);
  for (const Action& action : actions_) run.run(action);
  const double loss_sum = run.finish();  // 0 but on the last stage's rank
  tied_->sum_gradients(*pp_);
  // The loss to every rank, and whether any rank found a borrowed weight, in one reduction: every
  // rank then throws together rather than leaving the others waiting.
  const std::string borrowed = borrowed_->after_step();
  at::Tensor outcome = at::zeros({1 + pp_->size()}, at::kDouble);
  outcome[0] = loss_sum;
  outcome[1 + pp_->rank()] = borrowed.empty() ? 0.0 : 1.0;
  all_reduce_sum(*pp_, outcome);
  TORCH_CHECK(borrowed.empty(), borrowed);
  for (int r = 0; r < pp_->size(); ++r) {
    TORCH_CHECK(outcome[1 + r].item<double>() == 0.0, "pipeline: pp rank ", r, " found a weight that one of its ",
                "stages uses without holding it (the error there names it); its gradient would be lost");
  }
  return outcome[0].item<double>();
}

}  // namespace fsdp::pp
