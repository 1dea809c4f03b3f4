#include "model_settings.h"

#include <map>

namespace gpt {

nlohmann::json model_settings(const GPTConfig& config) {
  nlohmann::json rope_scaling = nullptr;
  if (config.rope_scaling) {
    const Llama3RopeScaling& s = *config.rope_scaling;
    rope_scaling = {{"factor", s.factor}, {"low_freq_factor", s.low_freq_factor},
                    {"high_freq_factor", s.high_freq_factor},
                    {"original_max_position_embeddings", s.original_context}};
  }
  return {{"model", config.family},
          {"layers", config.layers},
          {"dim", config.dim},
          {"heads", config.heads},
          {"seq", config.max_seq},
          {"vocab", config.vocab_size},
          {"context", config.context()},
          {"kv_heads", config.key_value_heads()},
          {"head_dim", config.head_size()},
          {"ffn_dim", config.mlp_dim()},
          {"norm_eps", config.norm_eps},
          {"rope_theta", config.rope_theta},
          {"rope_scaling", rope_scaling},
          {"tied_head", config.head_is_wte()},
          {"qkv_bias", config.qkv_bias}};
}

std::string setting_name(const std::string& setting) {
  static const std::map<std::string, std::string> flags = {
      {"model", "--model"}, {"layers", "--layers"}, {"dim", "--dim"}, {"heads", "--heads"},
      {"seq", "--seq"}, {"vocab", "--vocab"}, {"kv_heads", "--kv-heads"}, {"ffn_dim", "--ffn-dim"},
      {"rope_theta", "--rope-theta"}, {"tied_head", "--tie-head"}};
  const auto it = flags.find(setting);
  return it != flags.end() ? it->second : setting;
}

}  // namespace gpt
