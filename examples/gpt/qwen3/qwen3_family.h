#pragma once
// The Qwen3 family (--model qwen3; transformers' Qwen3ForCausalLM): its model (qwen3.h, built on
// the Llama's layers), its Hugging Face folders (hf_qwen3.cpp) and its blocks described to the
// planner with their tensor-parallel plan (qwen3_plan.cpp), as one ModelFamily (model_family.h).
// What it shares with the Llama it asks the Llama family for: the flags --kv-heads, --ffn-dim,
// --rope-theta and --tie-head (its own: --head-dim), their checks, the MLP's width, config.json's
// common keys and the tensors' names, the Llama block's description.

#include "model_family.h"

namespace gpt {

class Qwen3Family final : public ModelFamily {
 public:
  std::string name() const override { return "qwen3"; }
  std::string help() const override;
  std::string model_text() const override { return "Qwen3 model"; }
  std::string plan_kind() const override { return "Qwen3"; }

  /// The Llama's flags (added by the Llama family) and --head-dim.
  void add_flags(CLI::App& app, GPTConfig& model) const override;
  std::vector<std::string> flags() const override;
  void validate(const GPTConfig& config) const override;
  int64_t mlp_dim(const GPTConfig& config) const override;
  bool head_is_wte(const GPTConfig& config) const override { return config.tied_head; }

  GptLayers layers(const GPTConfig& config, GptCode code) const override;
  torch::nn::AnyModule attention(const GPTConfig& config) const override;
  torch::nn::AnyModule mlp(const GPTConfig& config) const override;

  // hf_qwen3.cpp
  std::vector<std::string> hf_model_types() const override { return {"qwen3"}; }
  std::string hf_types_text() const override { return "Qwen3's \"qwen3\""; }
  GPTConfig hf_config(const nlohmann::json& config, const std::string& where) const override;
  HfSizeKeys hf_size_keys() const override {
    return {"num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"};
  }
  /// The attention window of a Qwen3 whose layers slide (use_sliding_window) when it is shorter
  /// than the context: gpt_train attends to every earlier position.
  std::pair<std::string, std::string> hf_context_limit(const nlohmann::json& config,
                                                       const GPTConfig& model,
                                                       const std::string& where) const override;
  void untie_head(GPTConfig& model, const std::string&) const override { model.tied_head = false; }
  HfNaming hf_naming(const GPTConfig& config) const override;
  nlohmann::json hf_config_json(const GPTConfig& config, const nlohmann::json& base) const override;

  // qwen3_plan.cpp
  void describe_block(const GPTConfig& config, int64_t element_bytes, GptCode code, int64_t tp,
                      fsdp::PlanUnit& unit) const override;
  fsdp::tp::ParallelizePlan block_parallel_plan(const GPTConfig& config) const override;
};

const ModelFamily& qwen3_family();

}  // namespace gpt
