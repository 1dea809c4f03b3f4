#include "llama/llama.h"

#include <cmath>

namespace gpt {

GptLayers llama_layers(const GPTConfig& config) {
  const int64_t C = config.dim, V = config.vocab_size, I = config.mlp_dim();
  const int64_t q = config.heads * config.head_size(), kv = config.key_value_heads() * config.head_size();
  const double eps = config.norm_eps;
  const bool qkv_bias = config.qkv_bias;
  GptLayers layers;
  layers.before_blocks = {{"wte", LayerKind::Embedding, V, C}};
  layers.block = {{"ln_1", LayerKind::RMSNorm, C, C, false, eps},
                  {"attn.q_proj", LayerKind::Linear, C, q, qkv_bias},
                  {"attn.k_proj", LayerKind::Linear, C, kv, qkv_bias},
                  {"attn.v_proj", LayerKind::Linear, C, kv, qkv_bias},
                  {"attn.o_proj", LayerKind::Linear, q, C, false},
                  {"ln_2", LayerKind::RMSNorm, C, C, false, eps},
                  {"mlp.gate_proj", LayerKind::Linear, C, I, false},
                  {"mlp.up_proj", LayerKind::Linear, C, I, false},
                  {"mlp.down_proj", LayerKind::Linear, I, C, false}};
  layers.after_blocks = {{"ln_f", LayerKind::RMSNorm, C, C, false, eps}};
  if (!config.tied_head) layers.after_blocks.push_back({"lm_head", LayerKind::Linear, C, V, false});
  return layers;
}

torch::Tensor rope_inverse_frequencies(const GPTConfig& config) {
  const int64_t d = config.head_size();
  // As transformers computes it, in fp32: 1 / theta ** (arange(0, d, 2) / d).
  const torch::Tensor exponents = torch::arange(0, d, 2, torch::kLong).to(torch::kFloat) / d;
  torch::Tensor inv_freq = 1.0 / torch::pow(config.rope_theta, exponents);
  if (!config.rope_scaling) return inv_freq;
  const Llama3RopeScaling& s = *config.rope_scaling;
  const double old_context = static_cast<double>(s.original_context);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const torch::Tensor smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const torch::Tensor is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
  return torch::where(is_medium, smoothed, scaled);
}

LlamaAttentionImpl::LlamaAttentionImpl(const GPTConfig& config)
    : head_dim(config.head_size()),
      inverse_frequencies_(rope_inverse_frequencies(config)) {
  register_layers(*this, llama_layers(config).block, "attn.");
  q_proj = child<UninitializedLinear>(*this, "q_proj");
  k_proj = child<UninitializedLinear>(*this, "k_proj");
  v_proj = child<UninitializedLinear>(*this, "v_proj");
  o_proj = child<UninitializedLinear>(*this, "o_proj");
}

std::pair<torch::Tensor, torch::Tensor> LlamaAttentionImpl::rotary_tables(int64_t T,
                                                                          const torch::Tensor& like) {
  if (!cos_.defined() || cos_.size(0) != T || cos_.scalar_type() != like.scalar_type() ||
      cos_.device() != like.device()) {
    torch::NoGradGuard no_grad;
    const torch::Tensor positions = torch::arange(T, torch::kLong).to(torch::kFloat);
    const torch::Tensor angles = torch::outer(positions, inverse_frequencies_);  // [T, d/2]
    const torch::Tensor both_halves = torch::cat({angles, angles}, -1);         // [T, d]
    cos_ = both_halves.cos().to(like.options());
    sin_ = both_halves.sin().to(like.options());
  }
  return {cos_, sin_};
}

torch::Tensor LlamaAttentionImpl::split_heads(const torch::Tensor& projected) const {
  return projected.view({projected.size(0), projected.size(1), -1, head_dim});  // heads here: -1
}

torch::Tensor LlamaAttentionImpl::query_heads(const torch::Tensor& x) { return split_heads(q_proj(x)); }

torch::Tensor LlamaAttentionImpl::key_heads(const torch::Tensor& x) { return split_heads(k_proj(x)); }

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  const auto [cos, sin] = rotary_tables(T, x);
  // [B, heads here, T, head_dim]
  const torch::Tensor q = apply_rope(query_heads(x).transpose(1, 2), cos, sin);
  const torch::Tensor k = apply_rope(key_heads(x).transpose(1, 2), cos, sin);
  const torch::Tensor v = split_heads(v_proj(x)).transpose(1, 2);
  // Grouped-query attention in the kernel (enable_gqa): query head h reads key/value head
  // h / (heads / kv_heads), as transformers' repeat_kv lays them out, without copying k and v.
  const torch::Tensor y = at::scaled_dot_product_attention(
      q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, /*scale=*/std::nullopt,
      /*enable_gqa=*/q.size(1) != k.size(1));
  return o_proj(y.transpose(1, 2).reshape({B, T, -1}));
}

SwiGLUImpl::SwiGLUImpl(const GPTConfig& config) {
  register_layers(*this, llama_layers(config).block, "mlp.");
  gate_proj = child<UninitializedLinear>(*this, "gate_proj");
  up_proj = child<UninitializedLinear>(*this, "up_proj");
  down_proj = child<UninitializedLinear>(*this, "down_proj");
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

}  // namespace gpt
