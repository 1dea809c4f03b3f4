#include "pipeline_model.h"

#include "layer_table.h"

#include <c10/util/Exception.h>

namespace gpt {

namespace {

// GPT-2's learned positions added to the embedding ([Note: the GPT as a pipeline chain]); under
// tensor parallelism, to this rank's part of the sequence (as GPTImpl::forward).
struct AddPositionsImpl : torch::nn::Module {
  AddPositionsImpl(const torch::Tensor& wpe_weight, std::shared_ptr<fsdp::tp::TensorParallel> tp_group)
      : tp(std::move(tp_group)) {
    weight = register_parameter("weight", wpe_weight);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t sequence = x.size(1) * (tp ? tp->size() : 1);
    const auto positions = torch::nn::functional::embedding(
        torch::arange(sequence, x.options().dtype(torch::kLong)), weight);
    return x + (tp ? tp->chunk_along(positions, 0) : positions);
  }
  torch::Tensor weight;
  std::shared_ptr<fsdp::tp::TensorParallel> tp;
};
TORCH_MODULE(AddPositions);

// The head tied to wte: logits against the embedding's rows (under tensor parallelism, the whole
// sequence against this rank's rows, as GPTImpl::forward).
struct TiedHeadImpl : torch::nn::Module {
  TiedHeadImpl(const torch::Tensor& wte_weight, std::shared_ptr<fsdp::tp::TensorParallel> tp_group)
      : tp(std::move(tp_group)) {
    weight = register_parameter("weight", wte_weight);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::matmul(tp ? tp->gather_sequence(x) : x, weight.t());
  }
  torch::Tensor weight;
  std::shared_ptr<fsdp::tp::TensorParallel> tp;
};
TORCH_MODULE(TiedHead);

// Registers `module` in the view under `name` and appends it to the chain.
void add_part(PipelineChain& chain, const std::string& name, torch::nn::AnyModule module) {
  chain.view->register_module(name, module.ptr());
  chain.parts.push_back({name, std::move(module)});
}

}  // namespace

PipelineChain pipeline_chain(GPT& gpt) {
  PipelineChain chain{std::make_shared<torch::nn::Module>("PipelineChain"), {}};
  const auto wte = child<torch::nn::Embedding>(*gpt, "wte");
  add_part(chain, "wte", torch::nn::AnyModule(wte));
  if (gpt->wpe) add_part(chain, "wpe", torch::nn::AnyModule(AddPositions(gpt->wpe->weight, gpt->tp)));
  auto blocks = std::dynamic_pointer_cast<torch::nn::ModuleListImpl>(gpt->named_children()["h"]);
  TORCH_CHECK(blocks, "the GPT has no block list h");
  chain.view->register_module("h", blocks);
  // A sharded stage is one FSDP unit: the blocks' own fsdp::Unit holders let go of them (they
  // stay in the list h; the GPT's forward, which calls them through the holders, is not used).
  gpt->h.clear();
  for (size_t i = 0; i < blocks->size(); ++i) {
    Block block(std::dynamic_pointer_cast<BlockImpl>(blocks->ptr(i)));
    chain.parts.push_back({"h." + std::to_string(i), torch::nn::AnyModule(block)});
  }
  add_part(chain, "ln_f", norm_child(*gpt, gpt_layers(gpt->config).after_blocks, "ln_f"));
  if (gpt->config.head_is_wte()) {
    add_part(chain, "head", torch::nn::AnyModule(TiedHead(wte->weight, gpt->tp)));
  } else {
    add_part(chain, "lm_head", torch::nn::AnyModule(child<UninitializedLinear>(*gpt, "lm_head")));
  }
  return chain;
}

std::vector<std::vector<std::string>> stage_modules(const PipelineChain& chain, int64_t layers,
                                                    int num_stages) {
  TORCH_CHECK(layers >= num_stages, "--pp x --stages-per-rank = ", num_stages, " stages need at least ",
              num_stages, " blocks (--layers ", layers, "); give more --layers or fewer stages");
  std::vector<std::vector<std::string>> stages(num_stages);
  const int64_t base = layers / num_stages, extra = layers % num_stages;
  int stage = 0;
  int64_t left = base + (extra > 0 ? 1 : 0);  // blocks the current stage still takes
  for (const fsdp::pp::Part& part : chain.parts) {
    const bool is_block = part.name.rfind("h.", 0) == 0;
    if (is_block && left == 0) {
      ++stage;
      left = base + (stage < extra ? 1 : 0);
    }
    stages[stage].push_back(part.name);
    if (is_block) --left;
  }
  return stages;
}

fsdp::pp::Schedule pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return fsdp::pp::Schedule::GPipe;
  if (name == "1f1b") return fsdp::pp::Schedule::OneFOneB;
  if (name == "interleaved-1f1b") return fsdp::pp::Schedule::Interleaved1F1B;
  TORCH_CHECK(name == "zbv", "--pp-schedule ", name, ": use gpipe, 1f1b, interleaved-1f1b or zbv");
  return fsdp::pp::Schedule::ZBV;
}

fsdp::pp::LossFn summed_lm_loss(std::shared_ptr<fsdp::tp::TensorParallel> tp) {
  if (tp) {  // loss parallelism over the vocabulary-sharded logits: the mean, times the tokens
    return [tp](const torch::Tensor& logits, const torch::Tensor& targets) {
      return tp->cross_entropy(logits, targets) * static_cast<double>(targets.numel());
    };
  }
  return [](const torch::Tensor& logits, const torch::Tensor& targets) {
    namespace F = torch::nn::functional;
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}),
                            F::CrossEntropyFuncOptions().reduction(torch::kSum));
  };
}

}  // namespace gpt
