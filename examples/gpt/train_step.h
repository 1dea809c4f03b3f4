#pragma once
// One optimizer step of gpt_train over --grad-accum micro-batches, sharded or as the reference.

#include "data.h"
#include "gpt.h"
#include "step_precision.h"
#include "train_options.h"

#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>

#include <torch/optim/adamw.h>

#include <cstdint>

namespace gpt {

/// What every step of a run uses.
struct StepContext {
  const TrainOptions& options;
  const Corpus& corpus;
  fsdp::Unit<GPT>& model;
  torch::optim::AdamW& optimizer;
  StepPrecision& precision;
  fsdp::Distributed* dist;  // nullptr: the unsharded reference
  int world;                // the reference: the world size whose global batch it trains on
  int rank;
  c10::Device device;

  bool sharded() const { return dist != nullptr; }
};

struct StepResult {
  torch::Tensor loss;    // this rank's mean loss over its rows (a scalar on the device)
  bool skipped = false;  // fp16: some rank's gradients overflowed, so the optimizer did not step
};

/// Trains step `step`. Micro-batch m covers global rows [m·W·B, (m+1)·W·B): rank r trains on its
/// B of them, the reference on all.
StepResult train_step(const StepContext& ctx, int64_t step);

}  // namespace gpt
