#include "llama/llama_family.h"

#include "command_line.h"
#include "llama/llama.h"

namespace gpt {

std::string LlamaFamily::help() const {
  return "the Llama family's (RMSNorm, rotary positions, grouped-query attention, SwiGLU, an "
         "untied head)";
}

void LlamaFamily::add_flags(CLI::App& app, GPTConfig& model) const {
  app.add_option("--kv-heads", model.kv_heads,
                 "key/value heads, dividing --heads (grouped-query attention; "
                 "default: --heads)")
      ->check(integer_in(1, kMaxHeads));
  app.add_option("--ffn-dim", model.ffn_dim,
                 "SwiGLU's hidden width (default: 8·dim/3 rounded up to 32)")
      ->check(integer_in(1, kMaxDim * 16));
  app.add_option("--rope-theta", model.rope_theta, "the rotary base")
      ->check(real_at_least(0, /*strictly_above=*/true))
      ->capture_default_str();
  app.add_flag("--tie-head", model.tied_head,
               "the output head is wte (as Llama 3.2 1B's), not a matrix of its own");
}

std::vector<std::string> LlamaFamily::flags() const {
  return {"--kv-heads", "--ffn-dim", "--rope-theta", "--tie-head"};
}

void LlamaFamily::validate(const GPTConfig& config) const {
  const int64_t kv_heads = config.key_value_heads(), head_size = config.head_size();
  TORCH_CHECK(kv_heads >= 1 && config.heads % kv_heads == 0, "--kv-heads (", kv_heads,
              ") must divide --heads (", config.heads, "): each key/value head serves ",
              "a whole group of query heads");
  TORCH_CHECK(head_size >= 2 && head_size % 2 == 0, "a Llama's head size (", head_size,
              ") must be even: rotary embeddings rotate pairs of channels");
  TORCH_CHECK(mlp_dim(config) >= 1, "--ffn-dim must be >= 1, got ", mlp_dim(config));
  TORCH_CHECK(config.norm_eps > 0 && config.rope_theta > 0, "a Llama's rms_norm_eps and "
              "rope_theta must be positive, got ", config.norm_eps, " and ", config.rope_theta);
}

int64_t LlamaFamily::mlp_dim(const GPTConfig& config) const {
  return config.ffn_dim > 0 ? config.ffn_dim : (8 * config.dim / 3 + 31) / 32 * 32;
}

GptLayers LlamaFamily::layers(const GPTConfig& config, GptCode) const { return llama_layers(config); }

torch::nn::AnyModule LlamaFamily::attention(const GPTConfig& config) const {
  return torch::nn::AnyModule(LlamaAttention(config));
}

torch::nn::AnyModule LlamaFamily::mlp(const GPTConfig& config) const {
  return torch::nn::AnyModule(SwiGLU(config));
}

const ModelFamily& llama_family() {
  static const LlamaFamily family{};
  return family;
}

}  // namespace gpt

namespace gpt {

fsdp::tp::ParallelizePlan LlamaFamily::block_parallel_plan(const GPTConfig&) const {
  using namespace fsdp::tp;
  const auto rowwise = RowwiseParallel().output_layout(Layout::ShardSequence);
  return {{"attn.q_proj", ColwiseParallel()}, {"attn.k_proj", ColwiseParallel()},
          {"attn.v_proj", ColwiseParallel()}, {"attn.o_proj", rowwise},
          {"mlp.gate_proj", ColwiseParallel()}, {"mlp.up_proj", ColwiseParallel()},
          {"mlp.down_proj", rowwise}};
}

}  // namespace gpt
