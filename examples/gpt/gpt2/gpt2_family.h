#pragma once
// The GPT-2 family (--model gpt2, the default): its model (gpt2.h), its Hugging Face folders
// (hf_gpt2.cpp: GPT2LMHeadModel) and its blocks described to the planner (gpt2_plan.cpp), as
// one ModelFamily (model_family.h).

#include "model_family.h"

namespace gpt {

class Gpt2Family final : public ModelFamily {
 public:
  std::string name() const override { return "gpt2"; }
  std::string help() const override;
  std::string model_text() const override { return "GPT-2"; }
  std::string plan_kind() const override { return "GPT"; }

  void add_flags(CLI::App& app, GPTConfig& model) const override;
  std::vector<std::string> flags() const override { return {}; }
  void validate(const GPTConfig& config) const override;
  int64_t mlp_dim(const GPTConfig& config) const override { return 4 * config.dim; }
  bool head_is_wte(const GPTConfig&) const override { return true; }

  GptLayers layers(const GPTConfig& config, GptCode code) const override;
  torch::nn::AnyModule attention(const GPTConfig& config) const override;
  torch::nn::AnyModule mlp(const GPTConfig& config) const override;

  // hf_gpt2.cpp
  std::vector<std::string> hf_model_types() const override { return {"gpt2"}; }
  std::string hf_types_text() const override { return "\"gpt2\""; }
  GPTConfig hf_config(const nlohmann::json& config, const std::string& where) const override;
  HfSizeKeys hf_size_keys() const override { return {"n_layer", "n_embd", "n_head", "vocab_size"}; }
  std::pair<std::string, std::string> hf_context_limit(const nlohmann::json& config,
                                                       const GPTConfig& model,
                                                       const std::string& where) const override;
  void untie_head(GPTConfig& model, const std::string& where) const override;
  HfNaming hf_naming(const GPTConfig& config) const override;
  nlohmann::json hf_config_json(const GPTConfig& config, const nlohmann::json& base) const override;

  // gpt2_plan.cpp
  void describe_block(const GPTConfig& config, int64_t element_bytes, GptCode code, int64_t tp,
                      fsdp::PlanUnit& unit) const override;
  fsdp::tp::ParallelizePlan block_parallel_plan(const GPTConfig& config) const override;
};

const ModelFamily& gpt2_family();

}  // namespace gpt
