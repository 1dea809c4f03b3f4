#pragma once
// gpt_train's learning-rate schedule: --lr with --warmup-steps.

#include "train_options.h"

#include <torch/optim/optimizer.h>

#include <cstdint>

namespace gpt {

/// Linear warm-up to the peak, then cosine decay to a tenth of it; constant without warm-up.
double learning_rate(const TrainOptions& o, int64_t step);

/// Sets the learning rate of every parameter group (AdamW's).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace gpt
