#include "tensor_parallel_plan.h"

#include "model_family.h"

#include <string>

namespace gpt {

fsdp::tp::ParallelizePlan root_parallel_plan(const GPTConfig& config) {
  using namespace fsdp::tp;
  ParallelizePlan plan;
  for (const Layer& layer : gpt_layers(config).root()) {
    if (layer.name == "wte") {
      plan.push_back({"wte", RowwiseParallel().output_layout(Layout::ShardSequence)});
    } else if (layer.name == "lm_head") {
      plan.push_back({"lm_head", ColwiseParallel().input_layout(Layout::ShardSequence)});
    } else {
      // ln_f, and GPT-2's positions (wpe), added to the sequence shard: replicated, their
      // gradients summed over the ranks.
      plan.push_back({layer.name, SequenceParallel()});
    }
  }
  return plan;
}

fsdp::tp::ParallelizePlan block_parallel_plan(const GPTConfig& config) {
  using namespace fsdp::tp;
  ParallelizePlan plan;
  for (const Layer& layer : gpt_layers(config).block) {
    if (layer.kind == LayerKind::LayerNorm || layer.kind == LayerKind::RMSNorm) {
      plan.push_back({layer.name, SequenceParallel()});
    }
  }
  const auto gather = PrepareModuleInput().input_layout(Layout::ShardSequence).desired_input_layout(Layout::Replicate);
  plan.push_back({"attn", gather});
  plan.push_back({"mlp", gather});
  for (auto& entry : family_of(config).block_parallel_plan(config)) plan.push_back(entry);
  return plan;
}

fsdp::tp::ParallelizePlan tensor_parallel_plan(const GPTConfig& config) {
  fsdp::tp::ParallelizePlan plan = root_parallel_plan(config);
  for (auto& [path, style] : block_parallel_plan(config)) plan.push_back({"h.*." + path, style});
  return plan;
}

void check_tensor_parallel(const GPTConfig& config, int tp) {
  TORCH_CHECK(tp >= 1, "--tp must be >= 1, got ", tp);
  if (tp == 1) return;
  const auto split = [&](int64_t size, const std::string& what) {
    TORCH_CHECK(size % tp == 0, "--tp ", tp, ": ", what, " = ", size, " does not split over ", tp,
                " ranks; choose a --tp that divides it");
  };
  split(config.heads, "--heads (the query heads)");
  split(config.key_value_heads(), "--kv-heads (the key/value heads)");
  split(config.mlp_dim(), "--ffn-dim (the MLP's width)");
  split(config.vocab_size, "--vocab");
  split(config.max_seq, "--seq (split for sequence parallelism)");
}

void parallelize_gpt(GPT& model, std::shared_ptr<fsdp::tp::TensorParallel> tp) {
  check_tensor_parallel(model->config, tp->size());
  fsdp::tp::parallelize_module(*model, tp, tensor_parallel_plan(model->config));
  model->tp = std::move(tp);
}

}  // namespace gpt
