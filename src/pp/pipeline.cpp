// The runner: executes this rank's list of actions for one step ([Note: pipeline stages and
// schedules]).
#include <fsdp/pipeline.h>

#include "pp/activation_channel.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace fsdp::pp {

namespace {

// Tags of micro-batch mb's messages: its activation (header, values), its gradient (header, values).
int activation_tag(int mb) { return 4 * mb; }
int gradient_tag(int mb) { return 4 * mb + 2; }

std::vector<at::Tensor> split_batch(const at::Tensor& batch, int microbatches, const char* what) {
  TORCH_CHECK(batch.defined() && batch.dim() >= 1 && batch.size(0) % microbatches == 0, "pipeline: the step's ",
              what, " (", batch.defined() ? batch.sizes().vec() : std::vector<int64_t>{},
              ") do not split along dim 0 into ", microbatches,
              " equal micro-batches; give a batch whose first size is a multiple of the micro-batch count");
  return batch.chunk(microbatches, 0);
}

// What one step keeps of each micro-batch between its forward and its backward.
struct MicroBatchState {
  at::Tensor input;     // the stage's input (a leaf that requires grad, past the first stage)
  at::Tensor output;    // the stage's output (the scaled loss on the last stage)
  at::Tensor grad;      // the gradient of the output, from the next stage
};

// One step's state on this rank, and what each action does to it.
class StepRun {
 public:
  StepRun(Stage& stage, ProcessGroup& pp, const LossFn& loss_sum, StageSharding& sharding,
          const PipelineOptions& options)
      : stage_(stage),
        pp_(pp),
        loss_sum_(loss_sum),
        sharding_(sharding),
        reshard_after_microbatch_(options.reshard_after_microbatch()),
        mbs_(static_cast<size_t>(options.microbatches())) {}

  void set_batch(const at::Tensor& inputs, const at::Tensor& targets, int microbatches) {
    if (stage_.is_first()) inputs_ = split_batch(inputs, microbatches, "inputs");
    if (stage_.is_last()) {
      targets_ = split_batch(targets, microbatches, "targets");
      tokens_ = targets.numel();
    }
  }

  void run(const Action& a) {
    const bool computes = a.kind == ActionKind::Forward || a.kind == ActionKind::Backward;
    if (reshard_after_microbatch_ && computes) sharding_.unshard();  // gathered again, if resharded
    run_action(a);
    if (reshard_after_microbatch_ && a.kind == ActionKind::Backward) sharding_.reshard();
  }

  void run_action(const Action& a) {
    MicroBatchState* mb = a.microbatch >= 0 ? &mbs_.at(static_cast<size_t>(a.microbatch)) : nullptr;
    switch (a.kind) {
      case ActionKind::Unshard: return sharding_.unshard();
      case ActionKind::ReduceScatter: return sharding_.reduce_scatter();
      case ActionKind::Reshard: return sharding_.reshard();
      case ActionKind::RecvActivation: return recv_activation(*mb, a.microbatch);
      case ActionKind::Forward: return forward(*mb, a.microbatch);
      case ActionKind::SendActivation:
        return send_message(pp_, mb->output.detach(), stage_.index() + 1, activation_tag(a.microbatch), sends_);
      case ActionKind::RecvGradient: return recv_gradient(*mb, a.microbatch);
      case ActionKind::Backward: return backward(*mb);
      case ActionKind::SendGradient: return send_gradient(*mb, a.microbatch);
    }
  }

  // Every send has left; the step's loss (the last stage's) on every rank.
  double finish() {
    for (PendingSend& send : sends_) send.wait();
    sends_.clear();
    at::Tensor loss = at::tensor({loss_sum_of_step_}, at::kDouble);
    broadcast(pp_, loss, pp_.size() - 1);
    return loss.item<double>();
  }

 private:
  void recv_activation(MicroBatchState& mb, int index) {
    at::Tensor input = recv_message(pp_, stage_.index() - 1, activation_tag(index)).to(device());
    mb.input = at::isFloatingType(input.scalar_type()) ? input.requires_grad_(true) : input;
  }

  void forward(MicroBatchState& mb, int index) {
    if (stage_.is_first()) mb.input = inputs_.at(static_cast<size_t>(index)).to(device());
    mb.output = stage_.forward(mb.input);
    if (!stage_.is_last()) return;
    // The mean over the step's tokens, normalized once: this micro-batch's sum over the step's count.
    at::Tensor summed = loss_sum_(mb.output, targets_.at(static_cast<size_t>(index)).to(device()));
    TORCH_CHECK(summed.numel() == 1, "pipeline: the loss function returned ", summed.sizes(),
                "; it must return the micro-batch's loss summed over its tokens (one number)");
    mb.output = summed / static_cast<double>(tokens_);
    loss_sum_of_step_ += mb.output.item<double>();
  }

  void recv_gradient(MicroBatchState& mb, int index) {
    mb.grad = recv_message(pp_, stage_.index() + 1, gradient_tag(index)).to(device());
    TORCH_CHECK(mb.grad.sizes() == mb.output.sizes(), "pipeline: stage ", stage_.index() + 1,
                " sent a gradient of shape ", mb.grad.sizes(), " for micro-batch ", index, "'s output of shape ",
                mb.output.sizes(), "; the stages disagree on the model or the micro-batches");
  }

  void backward(MicroBatchState& mb) {
    if (stage_.is_last()) {
      mb.output.backward();
    } else {
      torch::autograd::backward({mb.output}, {mb.grad});
    }
    mb.output = at::Tensor();
    mb.grad = at::Tensor();
  }

  void send_gradient(MicroBatchState& mb, int index) {
    at::Tensor grad = mb.input.requires_grad() && mb.input.grad().defined() ? mb.input.grad()
                                                                            : at::zeros_like(mb.input);
    send_message(pp_, grad, stage_.index() - 1, gradient_tag(index), sends_);
    mb.input = at::Tensor();
  }

  c10::Device device() const {
    const auto params = stage_.parameters();
    return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  }

  Stage& stage_;
  ProcessGroup& pp_;
  const LossFn& loss_sum_;
  StageSharding& sharding_;
  bool reshard_after_microbatch_;
  std::vector<MicroBatchState> mbs_;
  std::vector<at::Tensor> inputs_, targets_;
  int64_t tokens_ = 0;
  double loss_sum_of_step_ = 0;
  std::vector<PendingSend> sends_;
};

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

}  // namespace

Pipeline::Pipeline(Stage stage, std::shared_ptr<ProcessGroup> pp, LossFn loss_sum, PipelineOptions options,
                   std::shared_ptr<StageSharding> sharding)
    : stage_(std::move(stage)),
      pp_(std::move(pp)),
      loss_sum_(std::move(loss_sum)),
      options_(options),
      sharding_(sharding_of(stage_, std::move(sharding), options_)) {
  TORCH_CHECK(pp_, "pipeline: no pp process group (give mesh.group_ptr(\"pp\"))");
  const std::vector<int> mine = stages_of_rank(pp_->rank(), pp_->size(), stage_.num_stages());
  TORCH_CHECK(std::find(mine.begin(), mine.end(), stage_.index()) != mine.end(), "pipeline: stage ",
              stage_.index(), " does not run on pp rank ", pp_->rank(), "; build Stage with the rank's ",
              "coordinate along \"pp\" (mesh.coordinate(\"pp\"))");
  TORCH_CHECK(loss_sum_, "pipeline: no loss function (a micro-batch's loss summed over its tokens)");
  actions_ = schedule_actions(options_.schedule(), stage_.num_stages(), options_.microbatches(), stage_.index());
}

double Pipeline::step(const torch::Tensor& inputs, const torch::Tensor& targets) {
  StepRun run(stage_, *pp_, loss_sum_, *sharding_, options_);
  run.set_batch(inputs, targets, options_.microbatches());
  for (const Action& action : actions_) run.run(action);
  return run.finish();
}

}  // namespace fsdp::pp
