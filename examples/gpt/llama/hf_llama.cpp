// Llama-family folders (transformers' LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) for
// hf_folder.h: LlamaFamily's hf_ methods. The model's slots hold the same tensors under gpt.h's
// names:
//   model.embed_tokens                       wte
//   model.layers.N.input_layernorm           h.N.ln_1
//   model.layers.N.self_attn.{q,k,v,o}_proj  h.N.attn.{q,k,v,o}_proj
//   model.layers.N.post_attention_layernorm  h.N.ln_2
//   model.layers.N.mlp.{gate,up,down}_proj   h.N.mlp.{gate,up,down}_proj
//   model.norm                               ln_f
//   lm_head                                  lm_head (absent when tied to the embedding)
// all in Linear's [out, in] layout, as the files hold them. Rotary frequencies are computed, not
// read (an old checkpoint's rotary_emb.inv_freq is skipped).
#include "llama/llama_family.h"

#include <fsdp/bounded_json.h>

#include <map>
#include <regex>

namespace gpt {

namespace hf {
namespace {

using nlohmann::json;

// Block names: the files' (below model.layers.N.) and the model's (below h.N.).
const std::vector<std::pair<std::string, std::string>>& block_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"input_layernorm.", "ln_1."}, {"self_attn.", "attn."},
      {"post_attention_layernorm.", "ln_2."}, {"mlp.", "mlp."}};
  return names;
}

const std::map<std::string, std::string>& root_names() {
  static const std::map<std::string, std::string> names = {
      {"model.embed_tokens.weight", "wte.weight"}, {"model.norm.weight", "ln_f.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  return names;
}

// `name` in the other naming: from the files' to the model's (`to_model`), or back; unchanged
// when it is neither a root nor a block tensor of a Llama.
std::string renamed(const std::string& name, bool to_model) {
  for (const auto& [file, model] : root_names()) {
    if (name == (to_model ? file : model)) return to_model ? model : file;
  }
  static const std::regex file_block(R"(model\.layers\.(\d+)\.(.*))"), model_block(R"(h\.(\d+)\.(.*))");
  std::smatch m;
  if (std::regex_match(name, m, to_model ? file_block : model_block)) {
    const std::string rest = m[2];
    for (const auto& [file, model] : block_names()) {
      const std::string& from = to_model ? file : model;
      if (rest.rfind(from, 0) != 0) continue;
      return (to_model ? "h." : "model.layers.") + m[1].str() + "." + (to_model ? model : file) +
             rest.substr(from.size());
    }
  }
  return name;
}

std::string model_name(const std::string& file_name) {
  if (ends_with(file_name, "rotary_emb.inv_freq")) return "";  // computed, not a parameter
  return renamed(file_name, /*to_model=*/true);  // a name not a Llama's: check() names it
}

std::string file_name(const std::string& name) { return renamed(name, /*to_model=*/false); }

// The rotary parameters' object as transformers 5 picks it: a non-empty rope_scaling (4.x's
// spelling) before rope_parameters; an empty one ({}) counts as absent.
json rope_object(const json& config, const std::string& where) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    TORCH_CHECK(config[key].is_object(), where, ": \"", key, "\" must be an object, got ",
                fsdp::json_excerpt(config[key]));
    if (config[key].empty()) continue;
    for (const auto& [name, value] : config[key].items()) {  // {"full_attention": {...}, ...}
      TORCH_CHECK(!value.is_object(), where, ": \"", key, "\" holds per-layer-type parameters (\"",
                  name, "\"), which transformers' ", text(config, "model_type", "", where),
                  " does not read; give one object: {\"rope_type\": ..., \"rope_theta\": ...}");
    }
    return config[key];
  }
  return json::object();
}

// A llama3 key that transformers requires (it refuses the config without it).
double llama3_number(const json& rope, const char* key, const std::string& where) {
  TORCH_CHECK(rope.contains(key) && !rope[key].is_null(), where, ": rope_type \"llama3\" needs \"",
              key, "\" (transformers refuses the config without it); add it to rope_parameters");
  return positive_number(rope, key, 0.0, where);
}

// The rotary parameters: transformers 5's rope_parameters, or 4.x's rope_scaling and rope_theta.
void read_rope(const json& config, const std::string& where, GPTConfig& c) {
  const json rope = rope_object(config, where);
  c.rope_theta = positive_number(rope, "rope_theta", positive_number(config, "rope_theta", 10000.0, where), where);
  const std::string type = text(rope, "rope_type", text(rope, "type", "default", where), where);
  require(rope, "partial_rotary_factor", 1.0, where, "rotates every channel of a head");
  if (type == "default") return;
  TORCH_CHECK(type == "llama3", where, ": rope_type \"", type, "\" is not one "
              "gpt_train's Llama computes; only \"default\" and Llama 3's \"llama3\" can be loaded");
  Llama3RopeScaling s;
  s.factor = llama3_number(rope, "factor", where);
  s.low_freq_factor = llama3_number(rope, "low_freq_factor", where);
  s.high_freq_factor = llama3_number(rope, "high_freq_factor", where);
  TORCH_CHECK(s.high_freq_factor > s.low_freq_factor, where, ": rope high_freq_factor (",
              s.high_freq_factor, ") must exceed low_freq_factor (", s.low_freq_factor, ")");
  // transformers' order: the top level's (Phi-3's spelling) first, then the rope object's, then
  // max_position_embeddings.
  const char* const key = "original_max_position_embeddings";
  const json& source = config.contains(key) && !config[key].is_null() ? config
                       : rope.contains(key) && !rope[key].is_null()    ? rope
                                                                       : json();
  s.original_context = source.is_null()
                           ? positive_size(config, "max_position_embeddings", where, kMaxPositions, "")
                           : positive_size(source, key, where, kMaxPositions, "a context no model has");
  c.rope_scaling = s;
}

// A Mistral's sliding_window always (transformers' Mistral has no use_sliding_window; 4096 when
// absent, none when null); a Qwen2's only with use_sliding_window.
int64_t sliding_window(const json& config, const std::string& where) {
  const std::string type = text(config, "model_type", "", where);
  if (type != "mistral" && type != "qwen2") return 0;
  if (type == "qwen2" && !boolean(config, "use_sliding_window", false, where)) return 0;
  if (!config.contains("sliding_window")) return 4096;  // MistralConfig's and Qwen2Config's default
  if (config["sliding_window"].is_null()) return 0;
  return positive_size(config, "sliding_window", where, kMaxPositions, "a context no model has");
}

}  // namespace
}  // namespace hf

using nlohmann::json;

std::string LlamaFamily::hf_types_text() const {
  return "the Llama family's \"llama\", \"mistral\" and \"qwen2\"";
}

std::pair<std::string, std::string> LlamaFamily::hf_context_limit(const json& config,
                                                                  const GPTConfig& model,
                                                                  const std::string& where) const {
  const int64_t window = hf::sliding_window(config, where);
  if (window > 0 && window == model.context() &&
      config.value("max_position_embeddings", json()) != window) {
    return {"sliding_window", "its attention window: gpt_train's attention has none, so it trains on "
                              "sequences within the window"};
  }
  return {"max_position_embeddings", "the model's context"};
}

GPTConfig LlamaFamily::hf_config(const json& config, const std::string& where) const {
  GPTConfig c;
  c.family = name();
  const std::string type = hf::text(config, "model_type", "", where);
  const bool qwen2 = type == "qwen2";
  c.vocab_size = hf::positive_size(config, "vocab_size", where, kMaxVocab, "the bound of --vocab");
  c.layers = hf::positive_size(config, "num_hidden_layers", where, kMaxLayers, "the bound of --layers");
  c.dim = hf::positive_size(config, "hidden_size", where, kMaxDim, "the bound of --dim");
  c.heads = hf::positive_size(config, "num_attention_heads", where, kMaxHeads, "the bound of --heads");
  c.kv_heads = config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()
                   ? hf::positive_size(config, "num_key_value_heads", where, kMaxHeads, "the bound of --heads")
                   : c.heads;
  c.head_dim = config.contains("head_dim") && !config["head_dim"].is_null()
                   ? hf::positive_size(config, "head_dim", where, kMaxDim, "the bound of --dim")
                   : c.dim / c.heads;
  c.ffn_dim = hf::positive_size(config, "intermediate_size", where, kMaxDim * 16, "16x the bound of --dim");
  c.positions = hf::positive_size(config, "max_position_embeddings", where, kMaxPositions,
                                  "a context no model has; --seq's bound is the run's");
  // Attention within a window of the last sliding_window tokens is full attention up to it.
  if (const int64_t window = hf::sliding_window(config, where)) c.positions = std::min(c.positions, window);
  c.max_seq = c.positions;
  c.norm_eps = hf::positive_number(config, "rms_norm_eps", 1e-6, where);
  c.tied_head = hf::boolean(config, "tie_word_embeddings", false, where);
  c.qkv_bias = qwen2;
  TORCH_CHECK(c.heads % c.kv_heads == 0, where, ": num_key_value_heads ", c.kv_heads,
              " does not divide num_attention_heads ", c.heads);
  TORCH_CHECK(c.head_dim % 2 == 0, where, ": head_dim ", c.head_dim, " is odd; rotary "
              "embeddings rotate pairs of channels");
  hf::require(config, "hidden_act", "silu", where, "gates its MLP with SiLU (SwiGLU)");
  hf::require(config, "attention_bias", false, where, "has no attention biases (but Qwen2's q/k/v)");
  hf::require(config, "mlp_bias", false, where, "has no MLP biases");
  hf::require(config, "attention_dropout", 0.0, where, "trains without attention dropout");
  hf::require(config, "pretraining_tp", 1, where, "computes its projections whole");
  hf::read_rope(config, where, c);
  c.validate();
  return c;
}

HfNaming LlamaFamily::hf_naming(const GPTConfig& config) const {
  HfNaming naming;
  naming.kind = "Llama";
  naming.tied_head = config.tied_head;
  naming.model_name = hf::model_name;
  naming.file_name = hf::file_name;
  naming.transposed = [](const std::string&) { return false; };
  return naming;
}

json LlamaFamily::hf_config_json(const GPTConfig& config, const json& base) const {
  json out = base.is_object() ? base : json::object();
  if (!base.is_object() || !out.contains("model_type")) {
    out["architectures"] = {"LlamaForCausalLM"};
    out["model_type"] = "llama";
  }
  out["vocab_size"] = config.vocab_size;
  out["hidden_size"] = config.dim;
  out["intermediate_size"] = config.mlp_dim();
  out["num_hidden_layers"] = config.layers;
  out["num_attention_heads"] = config.heads;
  out["num_key_value_heads"] = config.key_value_heads();
  out["head_dim"] = config.head_size();
  if (!base.is_object()) out["max_position_embeddings"] = config.context();
  out["rms_norm_eps"] = config.norm_eps;
  out["hidden_act"] = "silu";
  out["tie_word_embeddings"] = config.tied_head;
  // Both spellings: transformers 5 reads rope_parameters (rope_scaling first, when set), 4.x
  // rope_theta and rope_scaling.
  json rope = {{"rope_type", "default"}, {"rope_theta", config.rope_theta}};
  if (config.rope_scaling) {
    const Llama3RopeScaling& s = *config.rope_scaling;
    rope = {{"rope_type", "llama3"}, {"rope_theta", config.rope_theta}, {"factor", s.factor},
            {"low_freq_factor", s.low_freq_factor}, {"high_freq_factor", s.high_freq_factor},
            {"original_max_position_embeddings", s.original_context}};
  }
  out["rope_theta"] = config.rope_theta;
  out["rope_parameters"] = rope;
  out["rope_scaling"] = config.rope_scaling ? rope : json(nullptr);
  if (!base.is_object()) {  // trained without dropout, and with no special tokens
    out["attention_bias"] = false;
    out["mlp_bias"] = false;
    out["attention_dropout"] = 0.0;
    out["initializer_range"] = 0.02;
    out["bos_token_id"] = out["eos_token_id"] = nullptr;
  }
  return out;
}

}  // namespace gpt
