// Qwen3 folders (transformers' Qwen3ForCausalLM) for hf_folder.h: Qwen3Family's hf_ methods. The
// files name the tensors as a Llama's (llama/hf_llama.cpp), and the per-head norms
//   model.layers.N.self_attn.q_norm          h.N.attn.ln_q
//   model.layers.N.self_attn.k_norm          h.N.attn.ln_k
// config.json is read as the Llama family reads it (sizes, RoPE, silu, no biases), with Qwen3's
// own defaults and keys: head_dim 128 when absent (Qwen3Config's; not hidden_size / heads), and
// the attention window of sliding layers (use_sliding_window, sliding_window, layer_types,
// max_window_layers).
#include "qwen3/qwen3_family.h"

#include "llama/llama_family.h"

#include <fsdp/bounded_json.h>

#include <algorithm>
#include <utility>

namespace gpt {

namespace {

using nlohmann::json;

// The per-head norms' names: the files' (below a Llama's names, h.N.attn.) and the model's.
const std::pair<std::string, std::string> kHeadNorms[] = {{".attn.q_norm.", ".attn.ln_q."},
                                                           {".attn.k_norm.", ".attn.ln_k."}};

// `name` with a per-head norm's name in the other naming (`to_model`: the files' to the model's).
std::string head_norm_renamed(std::string name, bool to_model) {
  for (const auto& [file, model] : kHeadNorms) {
    const std::string& from = to_model ? file : model;
    const size_t at = name.find(from);
    if (at != std::string::npos) return name.replace(at, from.size(), to_model ? model : file);
  }
  return name;
}

// Whether `name` (a model's) is a per-head norm's.
bool is_head_norm(const std::string& name) {
  return std::any_of(std::begin(kHeadNorms), std::end(kHeadNorms),
                     [&](const auto& pair) { return name.find(pair.second) != std::string::npos; });
}

// The window of a Qwen3's sliding layers, or 0 when none slides. As transformers' Qwen3Config
// reads it: sliding_window (4096 when absent) only with use_sliding_window, none when null; the
// layers that layer_types names "sliding_attention" slide, or without layer_types, when there is
// a window, those from max_window_layers on (28 when absent).
int64_t sliding_window(const json& config, const std::string& where) {
  const bool use = hf::boolean(config, "use_sliding_window", false, where);
  const bool windowed = use && !(config.contains("sliding_window") && config["sliding_window"].is_null());
  bool slides = false;
  if (config.contains("layer_types") && !config["layer_types"].is_null()) {
    const json& types = config["layer_types"];
    TORCH_CHECK(types.is_array(), where, ": \"layer_types\" must be a list, got ", fsdp::json_excerpt(types));
    for (const json& type : types) {
      TORCH_CHECK(type == "full_attention" || type == "sliding_attention", where, ": \"layer_types\" holds ",
                  fsdp::json_excerpt(type), "; a Qwen3's layers are \"full_attention\" or \"sliding_attention\"");
      slides = slides || type == "sliding_attention";
    }
    TORCH_CHECK(!slides || windowed, where, ": \"layer_types\" names sliding layers, but ",
                use ? "\"sliding_window\" is null" : "\"use_sliding_window\" is not true",
                ", so they have no window (transformers' Qwen3 fails to build them); set "
                "\"use_sliding_window\": true and a \"sliding_window\", or make them \"full_attention\"");
  } else if (windowed) {
    int64_t first_sliding = 28;
    if (config.contains("max_window_layers") && !config["max_window_layers"].is_null()) {
      const json& value = config["max_window_layers"];
      TORCH_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0, where,
                  ": \"max_window_layers\" must be a whole number >= 0, got ", fsdp::json_excerpt(value));
      first_sliding = value.get<int64_t>();
    }
    slides = first_sliding < hf::positive_size(config, "num_hidden_layers", where, kMaxLayers, "the bound of --layers");
  }
  if (!slides) return 0;
  return config.contains("sliding_window")
             ? hf::positive_size(config, "sliding_window", where, kMaxPositions, "a context no model has")
             : 4096;
}

}  // namespace

GPTConfig Qwen3Family::hf_config(const json& config, const std::string& where) const {
  json filled = config;
  if (!filled.contains("head_dim")) filled["head_dim"] = 128;  // Qwen3Config's default
  TORCH_CHECK(!filled["head_dim"].is_null(), where, ": \"head_dim\" is null, which transformers' "
              "Qwen3 cannot build; give the channels per head (Qwen3Config's default: 128)");
  GPTConfig c = llama_family().hf_config(filled, where);
  c.family = name();
  // Attention within a window of the last sliding_window tokens is full attention up to it.
  if (const int64_t window = sliding_window(config, where)) c.positions = std::min(c.positions, window);
  c.max_seq = c.positions;
  c.validate();
  return c;
}

std::pair<std::string, std::string> Qwen3Family::hf_context_limit(const json& config,
                                                                  const GPTConfig& model,
                                                                  const std::string& where) const {
  const int64_t window = sliding_window(config, where);
  if (window > 0 && window == model.context() &&
      config.value("max_position_embeddings", json()) != window) {
    return {"sliding_window", "the attention window of its sliding layers: gpt_train's attention "
                              "has none, so it trains on sequences within the window"};
  }
  return {"max_position_embeddings", "the model's context"};
}

HfNaming Qwen3Family::hf_naming(const GPTConfig& config) const {
  HfNaming naming = llama_family().hf_naming(config);
  naming.kind = "Qwen3";
  naming.model_name = [llama = naming.model_name](const std::string& file_name) {
    const std::string as_llama = llama(file_name);
    // A file's own ln_q (not a Qwen3's name) stays unmapped: HfWeights::check names it.
    if (is_head_norm(as_llama)) return file_name;
    return head_norm_renamed(as_llama, /*to_model=*/true);
  };
  naming.file_name = [llama = naming.file_name](const std::string& name) {
    return llama(head_norm_renamed(name, /*to_model=*/false));
  };
  return naming;
}

json Qwen3Family::hf_config_json(const GPTConfig& config, const json& base) const {
  json out = llama_family().hf_config_json(config, base);
  if (!base.is_object() || !base.contains("model_type")) {
    out["architectures"] = {"Qwen3ForCausalLM"};
    out["model_type"] = "qwen3";
  }
  if (!base.is_object()) {
    out.erase("mlp_bias");  // not a key of Qwen3Config: its MLP has no biases
    out["use_sliding_window"] = false;
  }
  return out;
}

}  // namespace gpt
