#pragma once
// The Llama family (--model llama; Llama 2/3, Mistral, Qwen2, SmolLM): its model (llama.h,
// rms_norm.h, rotary.h), its Hugging Face folders (hf_llama.cpp: LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM) and its blocks described to the planner
// (llama_plan.cpp), as one ModelFamily (model_family.h).

#include "model_family.h"

namespace gpt {

class LlamaFamily final : public ModelFamily {
 public:
  std::string name() const override { return "llama"; }
  std::string help() const override;
  std::string model_text() const override { return "Llama-family model"; }
  std::string plan_kind() const override { return "Llama"; }

  void add_flags(CLI::App& app, GPTConfig& model) const override;
  std::vector<std::string> flags() const override;
  void validate(const GPTConfig& config) const override;
  /// --ffn-dim, else 8·dim/3 (SwiGLU's three matrices cost what GPT-2's two of 4·dim do),
  /// rounded up to a multiple of 32.
  int64_t mlp_dim(const GPTConfig& config) const override;
  bool head_is_wte(const GPTConfig& config) const override { return config.tied_head; }

  GptLayers layers(const GPTConfig& config, GptCode code) const override;
  torch::nn::AnyModule attention(const GPTConfig& config) const override;
  torch::nn::AnyModule mlp(const GPTConfig& config) const override;

  // hf_llama.cpp
  std::vector<std::string> hf_model_types() const override { return {"llama", "mistral", "qwen2"}; }
  std::string hf_types_text() const override;
  GPTConfig hf_config(const nlohmann::json& config, const std::string& where) const override;
  HfSizeKeys hf_size_keys() const override {
    return {"num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"};
  }
  /// A Mistral's attention window when it is shorter than the context: gpt_train attends to
  /// every earlier position, which is the window's attention only up to its length.
  std::pair<std::string, std::string> hf_context_limit(const nlohmann::json& config,
                                                       const GPTConfig& model,
                                                       const std::string& where) const override;
  void untie_head(GPTConfig& model, const std::string&) const override { model.tied_head = false; }
  HfNaming hf_naming(const GPTConfig& config) const override;
  nlohmann::json hf_config_json(const GPTConfig& config, const nlohmann::json& base) const override;

  // llama_plan.cpp
  void describe_block(const GPTConfig& config, int64_t element_bytes, GptCode code, int64_t tp,
                      fsdp::PlanUnit& unit) const override;
  fsdp::tp::ParallelizePlan block_parallel_plan(const GPTConfig& config) const override;
};

const ModelFamily& llama_family();

}  // namespace gpt
