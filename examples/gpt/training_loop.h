#pragma once
// The steps of a gpt_train run, from the first (0, or the resumed checkpoint's) to --steps: each
// timed and measured, logged, checked for a non-finite loss, and checkpointed when one is due.

#include "step_log.h"
#include "train_step.h"

#include <cstdint>
#include <vector>

namespace gpt {

/// Trains steps [first_step, ctx.options.steps) and returns each one's record (loss over the
/// global batch, time, this rank's memory and collective bytes). Throws when the losses stop being finite (nonfinite_guard.h), or when the model is not
/// finite at the end.
std::vector<StepRecord> run_steps(const StepContext& ctx, int64_t first_step, StepLog& log);

}  // namespace gpt
