#pragma once
// One optimizer step of gpt_train over --grad-accum micro-batches, sharded or as the reference:
// the mixed-precision side (the reference's own casts and loss
// scaling, the sharded run's fsdp::ShardedGradScaler), and the guard against a NaN/inf loss.

#include "data.h"
#include "gpt.h"
#include "options.h"
#include "train_optimizers.h"

#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>
#include <fsdp/grad_scaler.h>
#include <fsdp/options.h>
#include <fsdp/replica_quorum.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <vector>

namespace gpt {

// Mixed precision for the unsharded reference run, done the way FSDP does it but without
// sharding: forward and backward run on parameters cast to param_dtype; each backward's gradient
// is rounded to reduce_dtype and added, in fp32, to the master parameters' gradient, which the
// optimizer steps. The sharded run must then match it up to summation order.
class ReferencePrecision {
 public:
  ReferencePrecision(torch::nn::Module& model, const fsdp::MixedPrecision& policy);

  /// Before a forward: the parameters become param_dtype copies of the masters (no gradient).
  void cast_parameters();
  /// After its backward: the parameters are the masters again, the new gradient added to theirs.
  void restore_masters();

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> masters_;      // the fp32 data while the parameters are cast
  std::vector<torch::Tensor> master_grads_;  // gradients of earlier micro-batches
  fsdp::MixedPrecision policy_;
};

/// Dynamic loss scaling for the unsharded reference, written apart from the library's
/// fsdp::ShardedGradScaler (so that a bug there cannot show on both sides of a comparison), with
/// torch.amp.GradScaler's rules: gradients divided by the scale; a step with an inf or NaN
/// gradient is skipped and the scale multiplied by `backoff`; after `growth_interval` finite
/// steps in a row it is multiplied by `growth`.
class ReferenceLossScaler {
 public:
  explicit ReferenceLossScaler(double init_scale, double growth = 2.0, double backoff = 0.5,
                               int64_t growth_interval = 2000);

  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Unscales the gradients of the optimizer's parameters (before clipping sees them).
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Steps unless a gradient was not finite, then updates the scale. Returns whether it stepped.
  bool step_update(torch::optim::Optimizer& optimizer);
  /// unscale_, then step_update.
  bool unscale_step_update(torch::optim::Optimizer& optimizer);
  double current_scale() const { return scale_; }

 private:
  double scale_, growth_, backoff_;
  int64_t growth_interval_, finite_steps_ = 0;
  bool finite_ = true;  // the gradients unscale_ saw
};

// The mixed-precision side of a training step. fp16 needs loss scaling: the sharded run uses the
// library's fsdp::ShardedGradScaler, the reference its own code (torch.amp's rule written again,
// ReferenceLossScaler), so that a bug in the library's scaler cannot show on both sides. The
// reference under a mixed-precision policy also casts its own parameters (ReferencePrecision);
// the sharded run's FSDP units do that themselves.
class StepPrecision {
 public:
  /// What `o`'s policy needs for the sharded run (`dist` set) or the reference of `model`.
  StepPrecision(const TrainOptions& o, fsdp::Distributed* dist, GPT& model);

  /// Around each micro-batch's forward and backward (the reference's casts; else nothing).
  void before_forward();
  void after_backward();
  /// The loss to call backward on: scaled when fp16 scales it.
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Divides the gradients by the scale (before clipping sees them).
  void unscale(torch::optim::Optimizer& optimizer);
  /// Steps the optimizer unless a scaled gradient overflowed, and updates the scale. Gradients
  /// not unscaled yet are divided by the scale first, or by the optimizer's own kernel
  /// (fsdp::StepsScaledGradients). Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  /// The current loss scale (0: no loss scaling).
  double loss_scale() const;

 private:
  std::unique_ptr<fsdp::ShardedGradScaler> scaler_;          // fp16, sharded run
  std::unique_ptr<ReferenceLossScaler> reference_scaler_;    // fp16, reference run
  std::unique_ptr<ReferencePrecision> reference_precision_;  // reference with a policy
  bool unscaled_ = false;                                    // unscale() ran this step
};

// A NaN/inf loss in gpt_train: the run stops after --max-nonfinite-steps in a row (the ranks
// agree: the loss is all-reduced), and no checkpoint or output of a model whose parameters are
// not finite is written.
/// Whether every rank's parameters (its shards) are finite. One all-reduce of a count.
bool parameters_finite(GPT& gpt, fsdp::Distributed* dist);

class NonFiniteGuard {
 public:
  explicit NonFiniteGuard(const TrainOptions& o) : options_(o) {}

  /// After step `step` (0-based) with this global loss: throws when it is the
  /// --max-nonfinite-steps'th non-finite loss in a row.
  void count(double loss, int64_t step);
  /// After the last step: throws unless the last loss and every parameter are finite.
  void check_finished(GPT& gpt, fsdp::Distributed* dist) const;

 private:
  const TrainOptions& options_;
  int64_t consecutive_ = 0;  // steps in a row whose loss was NaN or inf
};

// One optimizer step of gpt_train over --grad-accum micro-batches, sharded or as the reference.
/// What every step of a run uses.
struct StepContext {
  const TrainOptions& options;
  const Corpus& corpus;
  fsdp::Unit<GPT>& model;
  TrainOptimizers& optimizers;  // a step steps optimizers.stepped()
  StepPrecision& precision;
  fsdp::Distributed* dist;  // nullptr: the unsharded reference
  int world;                // data-parallel ranks (the world / --tp); the reference: the world
                            // size whose global batch it trains on
  int rank;
  int data_rank;            // this rank's rows of the global batch: rank / --tp
  c10::Device device;
  fsdp::ReplicaQuorum* replicas = nullptr;  // --fault-tolerant: dist is this replica's ranks

  bool sharded() const { return dist != nullptr; }
};

struct StepResult {
  torch::Tensor loss;    // this rank's mean loss over its rows (a scalar on the device)
  bool skipped = false;  // fp16: some rank's gradients overflowed, so the optimizer did not step
  double optimizer_ms = 0;  // the optimizer's step (bench/: Muon's against AdamW's), host time
  std::optional<double> grad_norm;  // --clip: the global norm before clipping
  std::optional<fsdp::ReplicaStep> replicas;  // --fault-tolerant: the replicas averaged
};

/// Trains step `step`. Micro-batch m covers global rows [m·W·B, (m+1)·W·B): rank r trains on its
/// B of them, the reference on all.
StepResult train_step(const StepContext& ctx, int64_t step);

}  // namespace gpt
