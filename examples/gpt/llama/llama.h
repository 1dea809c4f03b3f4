#pragma once
// The Llama family's layers (Llama 2/3, Mistral, Qwen2, SmolLM), as transformers' LlamaForCausalLM
// computes them, in gpt.h's slots: a block is ln_1 (RMSNorm), attn (LlamaAttention: q_proj,
// k_proj, v_proj, o_proj), ln_2 (RMSNorm), mlp (SwiGLU: gate_proj, up_proj, down_proj); the root
// is wte, ln_f (RMSNorm) and, untied, lm_head. No wpe: positions are rotary (RoPE).

#include "gpt.h"
#include "layer_table.h"
#include "llama/rotary.h"

#include <torch/torch.h>

#include <vector>

namespace gpt {

/// The Llama's layers (GptLayers' slots), for LlamaFamily::layers.
GptLayers llama_layers(const GPTConfig& config);

/// The inverse frequencies of the rotary embedding, [head_size / 2] fp32: 1 / theta^(2i/d), with
/// Llama 3's scaling when config.rope_scaling is set (transformers' _compute_llama3_parameters).
torch::Tensor rope_inverse_frequencies(const GPTConfig& config);

/// Causal self-attention with rotary positions and grouped-query attention: the query heads
/// share the key/value heads (heads / kv_heads each; under tensor parallelism, this rank's of both).
struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // x: [B, T, dim]

  int64_t head_dim;
  // Column-wise (q, k, v) and row-wise (o) under tensor parallelism: each rank attends with its
  // heads, so the forward reads the head counts from the tensors (-1), never from the config.
  fsdp::tp::Parallel<UninitializedLinear> q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 protected:
  /// x's queries and keys before rotation, [B, T, heads here, head_dim]: the projections' output
  /// split into heads. An attention built on this one may change them (Qwen3 norms each head).
  virtual torch::Tensor query_heads(const torch::Tensor& x);
  virtual torch::Tensor key_heads(const torch::Tensor& x);
  /// A projection's output [B, T, heads · head_dim] as [B, T, heads, head_dim] (a view).
  torch::Tensor split_heads(const torch::Tensor& projected) const;

 private:
  /// cos and sin of positions 0..T-1 in `like`'s dtype and device, computed in fp32 once per
  /// (T, dtype, device): not parameters or buffers (a checkpoint holds none, as transformers').
  std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, const torch::Tensor& like);

  torch::Tensor inverse_frequencies_;  // fp32, on the CPU
  torch::Tensor cos_, sin_;            // the last tables made
};
TORCH_MODULE(LlamaAttention);

/// down_proj(silu(gate_proj(x)) · up_proj(x)).
struct SwiGLUImpl : torch::nn::Module {
  explicit SwiGLUImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  fsdp::tp::Parallel<UninitializedLinear> gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGLU);

}  // namespace gpt
