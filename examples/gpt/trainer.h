#pragma once
// The training loop of gpt_train, shared with the tests: the same code trains sharded (FSDP over
// the world process group) or as the unsharded single-process reference on the global batch.

#include "step_log.h"
#include "train_options.h"

#include <fsdp/distributed.h>

#include <string>
#include <utility>
#include <vector>

namespace gpt {

struct TrainResult {
  std::vector<double> losses;  // mean over the global batch, per step
  std::vector<std::pair<std::string, torch::Tensor>> final_params;  // full, original names
  std::string sample;
  std::vector<StepRecord> steps;  // this rank's measurements of each step
};

/// Sharded training when `dist` is set, otherwise the unsharded reference.
TrainResult train(const TrainOptions& options, fsdp::Distributed* dist);

}  // namespace gpt
