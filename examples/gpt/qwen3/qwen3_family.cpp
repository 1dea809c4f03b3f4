#include "qwen3/qwen3_family.h"

#include "command_line.h"
#include "llama/llama_family.h"
#include "qwen3/qwen3.h"

namespace gpt {

std::string Qwen3Family::help() const {
  return "Qwen3's (the Llama's layers with an RMSNorm on each query and key head; --head-dim may "
         "differ from dim/heads)";
}

void Qwen3Family::add_flags(CLI::App& app, GPTConfig& model) const {
  if (!app.get_option_no_throw("--kv-heads")) llama_family().add_flags(app, model);  // shared
  app.add_option("--head-dim", model.head_dim,
                 "channels per attention head, even (default: --dim / --heads; Qwen3's are 128 "
                 "at every width)")
      ->check(integer_in(2, kMaxDim));
}

std::vector<std::string> Qwen3Family::flags() const {
  std::vector<std::string> flags = llama_family().flags();
  flags.push_back("--head-dim");
  return flags;
}

void Qwen3Family::validate(const GPTConfig& config) const { llama_family().validate(config); }

int64_t Qwen3Family::mlp_dim(const GPTConfig& config) const { return llama_family().mlp_dim(config); }

GptLayers Qwen3Family::layers(const GPTConfig& config, GptCode) const { return qwen3_layers(config); }

torch::nn::AnyModule Qwen3Family::attention(const GPTConfig& config) const {
  return torch::nn::AnyModule(Qwen3Attention(config));
}

torch::nn::AnyModule Qwen3Family::mlp(const GPTConfig& config) const { return llama_family().mlp(config); }

const ModelFamily& qwen3_family() {
  static const Qwen3Family family{};
  return family;
}

}  // namespace gpt
