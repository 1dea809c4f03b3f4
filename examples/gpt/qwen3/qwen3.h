#pragma once
// The Qwen3 family's layers, as transformers' Qwen3ForCausalLM computes them, in gpt.h's slots:
// the Llama's (llama/llama.h: RMSNorm, rotary positions, grouped-query attention, SwiGLU) with
// an RMSNorm over each query head and each key head, after the q and k projections and before
// the rotation (q_norm, k_norm: one weight of head_dim, shared by the heads), and a head_dim of
// its own (config.json's, 128 when absent; it may differ from hidden_size / num_attention_heads).
// Those norms are attn.ln_q and attn.ln_k here: gpt.h's norms are named ln_*, which the recipe
// initialises to ones and keeps out of weight decay (gpt.cpp); hf_qwen3.cpp maps the names.

#include "gpt.h"
#include "layer_table.h"
#include "llama/llama.h"

#include <torch/torch.h>

namespace gpt {

/// The Qwen3's layers (GptLayers' slots): the Llama's, with attn.ln_q and attn.ln_k (RMSNorm
/// of head_dim) after attn.o_proj, as Qwen3Attention registers q_norm and k_norm.
GptLayers qwen3_layers(const GPTConfig& config);

/// LlamaAttention (q, k, v and o projections, rotation, grouped-query attention) whose queries
/// and keys are normed head by head before the rotation. Under tensor parallelism each rank norms
/// its own heads with the whole, replicated weights (tensor_parallel_plan.h: their gradients are
/// summed over the tp ranks).
struct Qwen3AttentionImpl : LlamaAttentionImpl {
  explicit Qwen3AttentionImpl(const GPTConfig& config);

  fsdp::tp::Parallel<RMSNorm> ln_q{nullptr}, ln_k{nullptr};

 protected:
  torch::Tensor query_heads(const torch::Tensor& x) override;
  torch::Tensor key_heads(const torch::Tensor& x) override;
};
TORCH_MODULE(Qwen3Attention);

}  // namespace gpt
