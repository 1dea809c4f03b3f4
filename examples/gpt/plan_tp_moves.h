#pragma once
// Tensor parallelism's collectives in the planner's GPT (gpt_plan.cpp): the family's own
// ParallelizePlan applied to the layer table, each styled layer's moves as its style describes
// them (fsdp::tp::moves_of, [Note: a style's two readers]); no layer is named here.

#include "gpt.h"

#include <fsdp/parallelize.h>
#include <fsdp/plan.h>

#include <string>
#include <vector>

namespace gpt {

/// The collectives of `table`'s modules (its rows and their groups: "attn" of "attn.q_proj") that
/// `plan` styles, on one of `tp` ranks, sequences of `seq` tokens, elements of `e` bytes; their
/// paths, and the parameters they sum, below `prefix` ("h.3.", "" for the root). None at tp 1.
std::vector<fsdp::PlanTpCollective> styled_tp_collectives(const std::vector<Layer>& table, const std::string& prefix,
                                                          const fsdp::tp::ParallelizePlan& plan, int64_t seq,
                                                          int64_t e, int64_t tp);

/// The root's: its styled layers' (the vocabulary-parallel embedding, the head, the replicated
/// norms and positions), the tied head's gather (the model's own call, no style's) and loss
/// parallelism's row maxima and sums (the loss's).
std::vector<fsdp::PlanTpCollective> root_tp_collectives(const GPTConfig& config, const GptLayers& layers, int64_t e,
                                                        int64_t tp);

}  // namespace gpt
