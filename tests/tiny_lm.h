#pragma once
// The tiny language model of the tensor-parallel tests (tests/tensor_parallel_test.cpp and the
// tp_*_test.cpp files): Embedding -> LayerNorm -> Megatron MLP -> head, held as LibTorch
// programs hold layers that tensor parallelism may split, its plan, and its seeds.
#include "dist_env.h"

#include <torch/torch.h>

#include <memory>
#include <utility>

namespace fsdp_test {

constexpr int64_t kDim = 12, kHidden = 24, kSeq = 12, kVocab = 36;  // divisible by 1, 2, 3 and 4

// Embedding -> LayerNorm -> Megatron MLP (column-wise up, row-wise down) -> head over the vocabulary.
struct TinyLmImpl : torch::nn::Module {
  TinyLmImpl() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    mlp = register_module("mlp", torch::nn::Sequential());  // only a holder of the MLP's path
    up = mlp->register_module("up", torch::nn::Linear(kDim, kHidden));
    down = mlp->register_module("down", torch::nn::Linear(kHidden, kDim));
    head = register_module("head", torch::nn::Linear(kDim, kVocab));
  }
  // Under tensor parallelism: the embedding's output on the sequence shard, the norm and the
  // residual there, the MLP on the gathered sequence, the head's logits over this rank's
  // vocabulary. The same code unsplit.
  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = norm(embed(ids));
    x = x + down(torch::gelu(up(x)));
    return head(x);
  }
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
    if (tp) return tp->cross_entropy(logits, targets);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
  }

  fsdp::tp::Parallel<torch::nn::Embedding> embed{nullptr};
  fsdp::tp::Parallel<torch::nn::LayerNorm> norm{nullptr};
  torch::nn::Sequential mlp{nullptr};
  fsdp::tp::Parallel<torch::nn::Linear> up{nullptr}, down{nullptr}, head{nullptr};
  std::shared_ptr<fsdp::tp::TensorParallel> tp;
};
TORCH_MODULE(TinyLm);

using fsdp::tp::Layout;

inline fsdp::tp::ParallelizePlan tiny_plan() {
  using namespace fsdp::tp;
  return {{"embed", RowwiseParallel().output_layout(Layout::ShardSequence)},
          {"norm", SequenceParallel()},
          {"mlp.up", ColwiseParallel().input_layout(Layout::ShardSequence)},
          {"mlp.down", RowwiseParallel().output_layout(Layout::ShardSequence)},
          {"head", ColwiseParallel().input_layout(Layout::ShardSequence)}};
}

inline std::shared_ptr<fsdp::tp::TensorParallel> world_tp() {
  return std::make_shared<fsdp::tp::TensorParallel>(dist().world);
}

inline TinyLm seeded_model() {
  torch::manual_seed(3);
  return TinyLm();
}

inline std::pair<torch::Tensor, torch::Tensor> batch() {
  torch::manual_seed(5);
  return {torch::randint(kVocab, {2, kSeq}, torch::kLong), torch::randint(kVocab, {2, kSeq}, torch::kLong)};
}

}  // namespace fsdp_test
