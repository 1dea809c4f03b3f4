// GPT-2 folders (transformers' GPT2LMHeadModel) for hf_folder.h: Gpt2Family's hf_ methods. The
// model already uses GPT-2's names (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...), which the files
// hold with or without the "transformer." prefix; GPT-2's four Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj) are [in, out] where the model's Linear ones are [out, in], so they are transposed
// both ways; lm_head.weight is tied to wte (skipped when read, left out when written, as
// save_pretrained does); attn.bias / attn.masked_bias are causal-mask buffers, not parameters.
#include "gpt2/gpt2_family.h"

#include <fsdp/bounded_json.h>

#include <cmath>

namespace gpt {

namespace hf {
namespace {

using nlohmann::json;

const char* const kPrefix = "transformer.";

// GPT-2's Conv1D weights, stored [in, out]: transposed to and from Linear's [out, in].
bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                             ".mlp.c_proj.weight"}) {
    if (name.size() > std::string(suffix).size() && ends_with(name, suffix)) return true;
  }
  return false;
}

// Tensors of a GPT-2 file that are not parameters of the model: the causal-mask buffers.
bool is_mask_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

}  // namespace
}  // namespace hf

using nlohmann::json;

GPTConfig Gpt2Family::hf_config(const json& config, const std::string& where) const {
  GPTConfig c;
  c.vocab_size = hf::positive_size(config, "vocab_size", where, kMaxVocab, "the bound of --vocab");
  c.positions = hf::positive_size(config, "n_positions", where, kMaxPositions,
                                  "a context no model has; --seq's bound is the run's");
  c.layers = hf::positive_size(config, "n_layer", where, kMaxLayers, "the bound of --layers");
  c.dim = hf::positive_size(config, "n_embd", where, kMaxDim, "the bound of --dim");
  c.heads = hf::positive_size(config, "n_head", where, kMaxHeads, "the bound of --heads");
  c.max_seq = c.positions;
  TORCH_CHECK(c.dim % c.heads == 0, where, ": n_embd ", c.dim, " is not a multiple of n_head ", c.heads);
  const json activation = config.value("activation_function", json("gelu_new"));
  TORCH_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", where,
              ": \"activation_function\" is ", fsdp::json_excerpt(activation), ", but gpt_train's GPT uses "
              "GPT-2's tanh GELU; only \"gelu_new\" (or \"gelu_pytorch_tanh\") can be loaded");
  if (config.contains("layer_norm_epsilon")) {
    const json& eps = config["layer_norm_epsilon"];
    TORCH_CHECK(eps.is_number() && std::abs(eps.get<double>() - 1e-5) <= 1e-12, where,
                ": \"layer_norm_epsilon\" is ", fsdp::json_excerpt(eps), ", but gpt_train's GPT uses "
                "LayerNorm's 1e-5; only 1e-5 can be loaded");
  }
  TORCH_CHECK(hf::boolean(config, "tie_word_embeddings", true, where), where, ": \"tie_word_embeddings\" "
              "is false, but gpt_train's GPT ties GPT-2's output head to wte; only true can be loaded");
  hf::require(config, "n_inner", 4 * c.dim, where, "has an MLP of 4·n_embd");
  hf::require(config, "scale_attn_weights", true, where, "scales attention by 1/sqrt(head_dim)");
  hf::require(config, "scale_attn_by_inverse_layer_idx", false, where,
              "does not scale attention by layer");
  hf::require(config, "add_cross_attention", false, where, "has no cross-attention");
  return c;
}

std::pair<std::string, std::string> Gpt2Family::hf_context_limit(const json&, const GPTConfig&,
                                                                 const std::string&) const {
  return {"n_positions", "the model's context"};
}

void Gpt2Family::untie_head(GPTConfig&, const std::string& where) const {
  TORCH_CHECK(false, where, " ties the head (\"tie_word_embeddings\"), but the weights "
              "hold an lm_head.weight that differs from the embedding; transformers loads it "
              "untied, which gpt_train's GPT-2 cannot represent (save the model tied, or as a Llama)");
}

HfNaming Gpt2Family::hf_naming(const GPTConfig&) const {
  HfNaming naming;
  naming.kind = "GPT-2";
  naming.tied_head = true;
  naming.model_name = [](const std::string& file_name) -> std::string {
    if (hf::is_mask_buffer(file_name)) return "";
    return file_name.rfind(hf::kPrefix, 0) == 0 ? file_name.substr(std::string(hf::kPrefix).size()) : file_name;
  };
  naming.file_name = [](const std::string& name) { return hf::kPrefix + name; };
  naming.transposed = hf::is_conv1d_weight;
  return naming;
}

json Gpt2Family::hf_config_json(const GPTConfig& config, const json& base) const {
  json out = base.is_object() ? base : json::object();
  out["architectures"] = {"GPT2LMHeadModel"};
  out["model_type"] = "gpt2";
  out["vocab_size"] = config.vocab_size;
  out["n_positions"] = config.context();
  out["n_layer"] = config.layers;
  out["n_embd"] = config.dim;
  out["n_head"] = config.heads;
  out["n_inner"] = nullptr;
  out["activation_function"] = "gelu_new";
  out["layer_norm_epsilon"] = 1e-5;
  out["tie_word_embeddings"] = true;
  if (!base.is_object()) {  // trained without dropout, and with no special tokens
    out["resid_pdrop"] = out["embd_pdrop"] = out["attn_pdrop"] = 0.0;
    out["initializer_range"] = 0.02;
    out["bos_token_id"] = out["eos_token_id"] = nullptr;  // GPT2Config's 50256 may not exist here
  }
  return out;
}

}  // namespace gpt
