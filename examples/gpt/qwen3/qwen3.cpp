#include "qwen3/qwen3.h"

#include <algorithm>
#include <iterator>

namespace gpt {

GptLayers qwen3_layers(const GPTConfig& config) {
  GptLayers layers = llama_layers(config);
  const int64_t d = config.head_size();
  const std::vector<Layer> head_norms = {{"attn.ln_q", LayerKind::RMSNorm, d, d, false, config.norm_eps},
                                         {"attn.ln_k", LayerKind::RMSNorm, d, d, false, config.norm_eps}};
  auto o_proj = std::find_if(layers.block.begin(), layers.block.end(),
                             [](const Layer& layer) { return layer.name == "attn.o_proj"; });
  TORCH_CHECK(o_proj != layers.block.end(), "the Llama's layer table has no attn.o_proj");
  layers.block.insert(std::next(o_proj), head_norms.begin(), head_norms.end());
  return layers;
}

Qwen3AttentionImpl::Qwen3AttentionImpl(const GPTConfig& config) : LlamaAttentionImpl(config) {
  // LlamaAttention registered the projections; the table's rows below "attn." that it lacks (the
  // norms) are registered here, after them.
  std::vector<Layer> norms;
  for (const Layer& layer : qwen3_layers(config).block) {
    if (layer.name.rfind("attn.", 0) == 0 && !named_children().contains(layer.name.substr(5))) {
      norms.push_back(layer);
    }
  }
  register_layers(*this, norms, "attn.");
  ln_q = child<RMSNorm>(*this, "ln_q");
  ln_k = child<RMSNorm>(*this, "ln_k");
}

torch::Tensor Qwen3AttentionImpl::query_heads(const torch::Tensor& x) { return ln_q(split_heads(q_proj(x))); }

torch::Tensor Qwen3AttentionImpl::key_heads(const torch::Tensor& x) { return ln_k(split_heads(k_proj(x))); }

}  // namespace gpt
