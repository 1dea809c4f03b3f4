#pragma once
// gpt_train --tp: the model split over the tensor-parallel ranks as torchtitan splits a Llama
// (docs/tensor-parallel.md): the embedding vocabulary-parallel with its output on the sequence
// shard, the norms sequence-parallel, each attention and MLP on the gathered sequence with its
// layers column-wise in and row-wise out (the family's block_parallel_plan), and the head
// column-wise over the vocabulary into loss parallelism.

#include "gpt.h"

#include <fsdp/parallelize.h>

#include <memory>

namespace gpt {

/// The plan of `config`'s model: the root's layers and every block's (paths from the model).
fsdp::tp::ParallelizePlan tensor_parallel_plan(const GPTConfig& config);
/// Its two halves: the root's own layers (wte, wpe, ln_f, lm_head), and a block's (paths from
/// the block: "attn.q_proj"), as --deferred-init splits each block before it is sharded.
fsdp::tp::ParallelizePlan root_parallel_plan(const GPTConfig& config);
fsdp::tp::ParallelizePlan block_parallel_plan(const GPTConfig& config);
/// Throws naming the flag whose size does not split over `tp` ranks (heads, key/value heads,
/// the MLP's width, the vocabulary, the sequence).
void check_tensor_parallel(const GPTConfig& config, int tp);
/// Splits `model` over `tp`'s ranks (tensor_parallel_plan) and keeps `tp` in it for its forward
/// and its loss.
void parallelize_gpt(GPT& model, std::shared_ptr<fsdp::tp::TensorParallel> tp);

}  // namespace gpt
