#include "gpt2/gpt2.h"

namespace gpt {

GptLayers gpt2_layers(const GPTConfig& config, GptCode code) {
  const int64_t C = config.dim, V = config.vocab_size;
  GptLayers layers;
  layers.before_blocks = {{"wte", LayerKind::Embedding, V, C},
                          {"wpe", LayerKind::Embedding, config.context(), C}};
  layers.block = {{"ln_1", LayerKind::LayerNorm, C, C},
                  {"attn.c_attn", LayerKind::Linear, C, 3 * C},  // q, k, v
                  {"attn.c_proj", LayerKind::Linear, C, C},      // residual projection
                  {"ln_2", LayerKind::LayerNorm, C, C},
                  {"mlp.c_fc", LayerKind::Linear, C, 4 * C},
                  {"mlp.c_proj", LayerKind::Linear, 4 * C, C}};  // residual projection
  layers.after_blocks = {{"ln_f", LayerKind::LayerNorm, C, C}};
  // This project's head is wte itself; minGPT's is a matrix of its own.
  if (code == GptCode::MinGpt) {
    layers.after_blocks.push_back({"lm_head", LayerKind::Linear, C, V, /*bias=*/false});
  }
  return layers;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& config) : head_dim(config.dim / config.heads) {
  register_layers(*this, gpt2_layers(config, GptCode::ThisProject).block, "attn.");
  c_attn = child<UninitializedLinear>(*this, "c_attn");
  c_proj = child<UninitializedLinear>(*this, "c_proj");
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  auto qkv = c_attn(x).chunk(3, /*dim=*/2);
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({B, T, -1, head_dim}).transpose(1, 2);  // [B, heads here, T, head_dim]
  };
  auto y = at::scaled_dot_product_attention(heads_first(qkv[0]), heads_first(qkv[1]),
                                            heads_first(qkv[2]), /*attn_mask=*/{},
                                            /*dropout_p=*/0.0, /*is_causal=*/true);
  return c_proj(y.transpose(1, 2).contiguous().view({B, T, -1}));
}

MLPImpl::MLPImpl(const GPTConfig& config) {
  register_layers(*this, gpt2_layers(config, GptCode::ThisProject).block, "mlp.");
  c_fc = child<UninitializedLinear>(*this, "c_fc");
  c_proj = child<UninitializedLinear>(*this, "c_proj");
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return c_proj(torch::gelu(c_fc(x), "tanh"));
}

}  // namespace gpt
