#pragma once
// gpt_train's optimizers (--optimizer): AdamW over the whole model (fused: fsdp::optim::AdamW;
// torch: LibTorch's), or Muon over the blocks' matrices and the fused AdamW over the rest
// (muon: Keller Jordan's recipe, the split fsdp::optim::split_for_muon makes). One learning-rate
// schedule scales both: each optimizer's peak (--lr, --muon-lr) times the same factor.

#include "gpt.h"
#include "muon_and_adamw.h"
#include "options.h"

#include <fsdp/muon.h>

#include <cstdint>
#include <memory>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <vector>

namespace gpt {

/// The factor of step `step` (0-based) in gpt_train's schedule: a linear warm-up to 1 over
/// --warmup-steps, then a cosine decay to 0.1; 1 throughout without warm-up.
double schedule_factor(const TrainOptions& o, int64_t step);

/// AdamW's learning rate at `step`: --lr times schedule_factor.
double learning_rate(const TrainOptions& o, int64_t step);

struct TrainOptimizers {
  std::unique_ptr<torch::optim::AdamW> adamw;  // the whole model, or (with muon) the rest
  std::unique_ptr<fsdp::optim::Muon> muon;     // --optimizer muon: the blocks' matrices
  std::unique_ptr<MuonAndAdamW> both;          // with muon: the two stepped as one

  /// What a step zeroes, scales and steps: `both` with Muon, else AdamW.
  torch::optim::Optimizer& stepped() const;
  /// What a checkpoint holds: AdamW, then Muon when there is one.
  std::vector<torch::optim::Optimizer*> saved() const;
  /// What steps units during backward (fsdp::optim::StepInBackward): the fused AdamW and Muon;
  /// empty with LibTorch's AdamW, which cannot.
  std::vector<fsdp::optim::StepsInBackward*> in_backward() const;
  /// Sets every param group's learning rate for step `step`: AdamW's --lr and Muon's --muon-lr,
  /// each times schedule_factor.
  void set_learning_rates(const TrainOptions& o, int64_t step);
  /// Whether some optimizer holds state (has taken a step).
  bool has_state() const;
  /// Forgets every optimizer's state (--reset-optimizer).
  void clear_state();
};

/// The optimizers of `o` over `model` (sharded or not: call it after fully_shard too, the
/// parameters are the same tensors), at the peak learning rates.
TrainOptimizers make_train_optimizers(GPT& model, const TrainOptions& o);

/// --optimizer muon's optimizers over `split` (a model's split_for_muon, or a pipeline stage's
/// part of it): Muon on its matrices, the fused AdamW on the rest.
TrainOptimizers make_muon_optimizers(const fsdp::optim::MuonSplit& split, const TrainOptions& o);

}  // namespace gpt
