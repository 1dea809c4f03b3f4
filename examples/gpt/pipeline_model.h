#pragma once
// gpt_train --pp: a GPT of any family as the forward chain that fsdp::pp::Stage splits
// ([Note: pipeline stages and schedules] in include/fsdp/pipeline.h), and its split into stages.

#include "gpt.h"

#include <fsdp/pipeline.h>

#include <memory>
#include <string>
#include <vector>

namespace gpt {

// [Note: the GPT as a pipeline chain]
// GPTImpl::forward is not a chain of its children: the positions are added to the embedding and
// the tied head reads wte's weight. The chain is a view of the model: a module holding the GPT's
// own modules (wte, h, ln_f, lm_head) under their names, with two small modules for the rest:
// "wpe" adds the positions (its weight is the GPT's wpe.weight) and "head", the tied head, holds
// wte.weight again (the pipeline finds the tie by tensor). Every tensor is the GPT's, so the
// stages train the GPT that make_gpt built, as the reference does, with the same initial values.
struct PipelineChain {
  std::shared_ptr<torch::nn::Module> view;  // the chain's modules under the GPT's names
  std::vector<fsdp::pp::Part> parts;        // wte, [wpe], h.0 .. h.L-1, ln_f, lm_head | head
};
/// The chain of `gpt` (split over its tp ranks first, when --tp), whose own forward is not used afterwards (its fsdp::Unit holders of the
/// blocks are released: a sharded stage is one FSDP unit).
PipelineChain pipeline_chain(GPT& gpt);

/// The modules of each of `num_stages` stages: the embeddings with the first blocks, the final
/// norm and the head with the last; the blocks split evenly, the first stages taking one more
/// when they do not divide. Throws unless every stage gets a block (--layers >= stages).
std::vector<std::vector<std::string>> stage_modules(const PipelineChain& chain, int64_t layers,
                                                    int num_stages);

/// --pp-schedule's value: gpipe | 1f1b | interleaved-1f1b | zbv.
fsdp::pp::Schedule pipeline_schedule(const std::string& name);

/// A micro-batch's next-token cross-entropy summed over its tokens (in fp32, as lm_loss); with
/// `tp`, over its vocabulary-sharded logits (loss parallelism, as GPTImpl::loss).
fsdp::pp::LossFn summed_lm_loss(std::shared_ptr<fsdp::tp::TensorParallel> tp);

}  // namespace gpt
