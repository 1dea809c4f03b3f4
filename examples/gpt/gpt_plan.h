#pragma once
// The planner's view of gpt_train's GPT (fsdp::PlanModel): parameters by unit from the
// configuration alone, and what each block, the embeddings and the head keep for backward, counted
// op by op from gpt.cpp ([Note: GPT activations] in gpt_plan.cpp).

#include "train_options.h"

#include <fsdp/plan.h>

namespace gpt {

/// Whose blocks: this project's GPT (gpt.cpp: fused attention, tanh-GELU, head tied to wte), or
/// minGPT's (the paper's: attention scores kept for backward, dropout 0.1, GELU as elementwise
/// ops, an untied head).
enum class GptCode { ThisProject, MinGpt };

/// The GPT of `config` computing in `compute_dtype`; `resident_bytes`: the program's own tensors
/// (the training data).
fsdp::PlanModel describe_gpt(const GPTConfig& config, c10::ScalarType compute_dtype, int64_t resident_bytes,
                             GptCode code = GptCode::ThisProject);

/// The bytes of training data gpt_train will hold for `o` (its --data, up to --max-data-mb).
int64_t training_data_bytes(const TrainOptions& o);

/// The setup of a run of `o` on `world` ranks, `ranks_per_host` to a host.
fsdp::PlanSetup plan_setup(const TrainOptions& o, int world, int ranks_per_host,
                           const fsdp::PlanDevice& device, const fsdp::PlanLinks& links);

}  // namespace gpt
