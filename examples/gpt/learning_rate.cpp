#include "learning_rate.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>

namespace gpt {

double learning_rate(const TrainOptions& o, int64_t step) {
  if (o.warmup_steps <= 0) return o.lr;
  if (step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  const double progress =
      double(step - o.warmup_steps) / double(std::max<int64_t>(1, o.steps - o.warmup_steps));
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

}  // namespace gpt
