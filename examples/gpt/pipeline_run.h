#pragma once
// gpt_train --pp P: the GPT split into P x V stages (pipeline_model.h), run by fsdp::pp::Pipeline
// over the mesh pp x dp (dp = world / P; each stage sharded over dp when dp > 1), each step
// --microbatches M micro-batches of --batch rows per dp rank. It trains what
// `gpt_train --reference --world-size dp --grad-accum M` trains: micro-batch m of dp rank d is
// the reference's micro-batch m's rows [m·dp·B + d·B, +B).

#include "trainer.h"

#include <fsdp/distributed.h>

namespace gpt {

/// The training run of gpt_train --pp on `dist`'s ranks; the losses are the global batch's, on
/// every rank (the last stage's, averaged over dp).
TrainResult train_pipeline(const TrainOptions& o, fsdp::Distributed& dist);

}  // namespace gpt
