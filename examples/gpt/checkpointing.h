#pragma once
// gpt_train's checkpoints: --save-every N --checkpoint-dir DIR --resume. Sharded checkpoints
// (fsdp/checkpoint.h) in DIR/step-NNNNNNNN, DIR/latest naming the newest complete one. The data
// position is the step: the global batch of a step is a pure function of (data, seed, step), so
// resuming at step s trains on exactly the batches the uninterrupted run would have.

#include "gpt.h"
#include "trainer.h"

#include <torch/optim/adamw.h>

#include <cstdint>
#include <string>

namespace gpt {

/// Loads the newest checkpoint in `dir` into the model and optimizer and returns the step to
/// continue from; 0 when `dir` holds none yet (a first run). Throws if the checkpoint was trained
/// with another seed (other batches) and names both. `rank` 0 prints what it loaded.
///
/// Example:
///   const int64_t first_step = o.resume ? resume_from_checkpoint(model, *optimizer, dir, o, rank)
///                                    : 0;
int64_t resume_from_checkpoint(fsdp::Unit<GPT>& model, torch::optim::AdamW& optimizer,
                               const std::string& dir, const TrainOptions& o, int rank);

/// After step `step` (0-based) has been trained: every `every` steps, and after the last step,
/// saves a checkpoint that resumes at step + 1 (keeping the newest two). No-op when every <= 0.
///
/// Example:
///   save_checkpoint_if_due(model, *optimizer, dir, o.save_every, step, o);
void save_checkpoint_if_due(fsdp::Unit<GPT>& model, torch::optim::AdamW& optimizer,
                            const std::string& dir, int64_t every, int64_t step,
                            const TrainOptions& o);

}  // namespace gpt
