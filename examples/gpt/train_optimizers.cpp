#include "train_optimizers.h"

#include <fsdp/fused_adamw.h>

#include <algorithm>
#include <cmath>

namespace gpt {

double schedule_factor(const TrainOptions& o, int64_t step) {
  if (o.warmup_steps <= 0) return 1.0;
  if (step < o.warmup_steps) return double(step + 1) / double(o.warmup_steps);
  const double progress =
      double(step - o.warmup_steps) / double(std::max<int64_t>(1, o.steps - o.warmup_steps));
  return 0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

double learning_rate(const TrainOptions& o, int64_t step) {
  // As before the factor existed (o.lr * (step + 1) / warmup_steps in warm-up): the same bits.
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  return o.lr * schedule_factor(o, step);
}

namespace {

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace

torch::optim::Optimizer& TrainOptimizers::stepped() const {
  if (both) return *both;
  return *adamw;
}

std::vector<torch::optim::Optimizer*> TrainOptimizers::saved() const {
  std::vector<torch::optim::Optimizer*> optimizers{adamw.get()};
  if (muon) optimizers.push_back(muon.get());
  return optimizers;
}

std::vector<fsdp::optim::StepsInBackward*> TrainOptimizers::in_backward() const {
  std::vector<fsdp::optim::StepsInBackward*> optimizers;
  if (auto* fused = dynamic_cast<fsdp::optim::AdamW*>(adamw.get())) optimizers.push_back(fused);
  if (muon && !optimizers.empty()) optimizers.push_back(muon.get());
  return optimizers;
}

void TrainOptimizers::set_learning_rates(const TrainOptions& o, int64_t step) {
  set_learning_rate(*adamw, learning_rate(o, step));
  if (muon) set_learning_rate(*muon, o.muon_lr * schedule_factor(o, step));
}

bool TrainOptimizers::has_state() const {
  return !adamw->state().empty() || (muon && !muon->state().empty());
}

void TrainOptimizers::clear_state() {
  for (torch::optim::Optimizer* optimizer : saved()) optimizer->state().clear();
}

TrainOptimizers make_train_optimizers(GPT& model, const TrainOptions& o) {
  TrainOptimizers optimizers;
  if (!o.muon) {
    optimizers.adamw = make_optimizer(model, o.lr, o.weight_decay, o.fused_optimizer);
    return optimizers;
  }
  return make_muon_optimizers(fsdp::optim::split_for_muon(*model), o);
}

TrainOptimizers make_muon_optimizers(const fsdp::optim::MuonSplit& split, const TrainOptions& o) {
  TrainOptimizers optimizers;
  TORCH_CHECK(!split.matrices.empty(), "--optimizer muon: the model has no hidden matrix that "
              "trains (every block's matrices are frozen by --freeze?); use --optimizer fused");
  optimizers.adamw = make_optimizer(split.other_names, split.others, o.lr, o.weight_decay,
                                    /*fused=*/true);
  optimizers.muon = std::make_unique<fsdp::optim::Muon>(
      split.matrices, fsdp::optim::MuonOptions(o.muon_lr)
                          .weight_decay(o.weight_decay)
                          .adjust_lr_fn(o.muon_adjust_lr));
  optimizers.both = std::make_unique<MuonAndAdamW>(
      *optimizers.muon, static_cast<fsdp::optim::AdamW&>(*optimizers.adamw));
  return optimizers;
}

}  // namespace gpt
