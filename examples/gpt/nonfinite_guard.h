#pragma once
// A NaN/inf loss in gpt_train: the run stops after --max-nonfinite-steps in a row (the ranks
// agree: the loss is all-reduced), and no checkpoint or output of a model whose parameters are
// not finite is written.

#include "gpt.h"
#include "train_options.h"

#include <fsdp/distributed.h>

#include <cstdint>

namespace gpt {

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

}  // namespace gpt
