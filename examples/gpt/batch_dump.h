#pragma once
// gpt_train --dump-batches FILE: the global batches of the whole run, for a peer implementation
// to train on the same data.

#include "data.h"
#include "train_options.h"

namespace gpt {

/// Writes {"inputs": [steps, global_rows, seq], "targets": [steps, global_rows, seq]} as int64
/// to o.dump_batches, where global_rows = grad_accum × world × batch (micro-batch m: rows
/// [m·W·B, (m+1)·W·B)).
void dump_batches(const TrainOptions& o, const Corpus& corpus, int world);

}  // namespace gpt
