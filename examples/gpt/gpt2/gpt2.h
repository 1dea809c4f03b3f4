#pragma once
// The GPT-2's layers (gpt2_family.h's model): a block is ln_1 (LayerNorm), attn
// (CausalSelfAttention: c_attn, c_proj), ln_2 (LayerNorm), mlp (MLP: c_fc, c_proj); the root is
// wte, wpe (learned positions) and ln_f, the head tied to wte.

#include "gpt.h"
#include "layer_table.h"

#include <torch/torch.h>

namespace gpt {

/// The GPT-2's layers (GptLayers' slots); minGPT's (GptCode::MinGpt) add a head of its own.
GptLayers gpt2_layers(const GPTConfig& config, GptCode code);

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // x: [B, T, dim]

  int64_t head_dim;
  // c_attn column-wise (q, k and v split alike), c_proj row-wise under tensor parallelism: each
  // rank attends with its heads, their count read from the tensors.
  fsdp::tp::Parallel<UninitializedLinear> c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// c_proj(gelu_tanh(c_fc(x))).
struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  fsdp::tp::Parallel<UninitializedLinear> c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(MLP);

}  // namespace gpt
