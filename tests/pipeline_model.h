#pragma once
// The pipeline tests' model, of a user's shape: an embedding, blocks in a ModuleList, a norm, a
// head, called through ->forward; and its forward as a chain of its own modules (the parts a
// fsdp::pp::Stage selects from). tests/pipeline_test.cpp and tests/pipeline_fsdp_test.cpp.
#include <fsdp/pipeline.h>

#include <torch/torch.h>

#include <string>
#include <vector>

namespace fsdp_test {

constexpr int64_t kPpVocab = 32, kPpDim = 16, kPpBlocks = 4;

struct PpBlockImpl : torch::nn::Module {
  PpBlockImpl() {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kPpDim})));
    fc1 = register_module("fc1", torch::nn::Linear(kPpDim, 2 * kPpDim));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kPpDim, kPpDim));
  }
  torch::Tensor forward(torch::Tensor x) { return x + fc2->forward(torch::gelu(fc1->forward(ln->forward(x)))); }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(PpBlock);

struct PpNetImpl : torch::nn::Module {
  PpNetImpl() {
    wte = register_module("wte", torch::nn::Embedding(kPpVocab, kPpDim));
    h = register_module("h", torch::nn::ModuleList());
    for (int i = 0; i < kPpBlocks; ++i) {
      blocks.push_back(PpBlock());
      h->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kPpDim})));
    head = register_module("head", torch::nn::Linear(kPpDim, kPpVocab));
  }
  torch::Tensor forward(torch::Tensor ids) {
    torch::Tensor x = wte->forward(ids);
    for (auto& block : blocks) x = block->forward(x);
    return head->forward(ln_f->forward(x));
  }
  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<PpBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(PpNet);

inline PpNet seeded_pp_net() {
  torch::manual_seed(0);  // LibTorch seeds each process at random: the same model on every rank
  return PpNet();
}

// The model's forward, as a chain of its own modules.
inline std::vector<fsdp::pp::Part> parts_of(PpNet& net) {
  std::vector<fsdp::pp::Part> parts{{"wte", torch::nn::AnyModule(net->wte)}};
  for (int i = 0; i < kPpBlocks; ++i) {
    parts.push_back({"h." + std::to_string(i), torch::nn::AnyModule(net->blocks[static_cast<size_t>(i)])});
  }
  parts.push_back({"ln_f", torch::nn::AnyModule(net->ln_f)});
  parts.push_back({"head", torch::nn::AnyModule(net->head)});
  return parts;
}

}  // namespace fsdp_test
