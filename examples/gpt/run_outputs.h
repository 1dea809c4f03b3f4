#pragma once
// What gpt_train writes of the trained model: --save-full (rank 0, the full parameters as a
// torch.save dict) and --export-hf (rank 0, a transformers GPT-2 folder), and the full parameters
// that gpt::train returns.

#include "gpt.h"
#include "train_options.h"

#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>
#include <fsdp/state_dict.h>

namespace gpt {

/// Writes the full parameters to o.save_full (a collective when sharded: rank 0 writes).
void save_full(const TrainOptions& o, fsdp::Unit<GPT>& model, fsdp::Distributed* dist);

/// The full parameters under their original names, on every rank (a copy, detached).
fsdp::NamedTensors full_params(fsdp::Unit<GPT>& model, fsdp::Distributed* dist);

/// --export-hf: rank 0 writes the folder; every rank learns whether it could, and throws if not.
void export_hf(const TrainOptions& o, const fsdp::NamedTensors& full_params,
               fsdp::Distributed* dist);

}  // namespace gpt
