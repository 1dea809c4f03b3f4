#include "gpt2/gpt2_family.h"

#include "gpt2/gpt2.h"

namespace gpt {

std::string Gpt2Family::help() const {
  return "GPT-2's architecture (LayerNorm, learned positions, GELU, head tied to wte)";
}

void Gpt2Family::add_flags(CLI::App&, GPTConfig&) const {}  // its sizes are the shared flags'

void Gpt2Family::validate(const GPTConfig&) const {}  // as many key/value heads as heads, 4·dim

GptLayers Gpt2Family::layers(const GPTConfig& config, GptCode code) const {
  return gpt2_layers(config, code);
}

torch::nn::AnyModule Gpt2Family::attention(const GPTConfig& config) const {
  return torch::nn::AnyModule(CausalSelfAttention(config));
}

torch::nn::AnyModule Gpt2Family::mlp(const GPTConfig& config) const {
  return torch::nn::AnyModule(MLP(config));
}

const ModelFamily& gpt2_family() {
  static const Gpt2Family family{};
  return family;
}

}  // namespace gpt

namespace gpt {

fsdp::tp::ParallelizePlan Gpt2Family::block_parallel_plan(const GPTConfig&) const {
  using namespace fsdp::tp;
  const auto rowwise = RowwiseParallel().output_layout(Layout::ShardSequence);
  return {{"attn.c_attn", ColwiseParallel().fused_chunks(3)},  // q, k and v side by side
          {"attn.c_proj", rowwise},
          {"mlp.c_fc", ColwiseParallel()},
          {"mlp.c_proj", rowwise}};
}

}  // namespace gpt
