// A layer of a tensor-parallel plan called as LibTorch programs call layers: `layer->forward(x)`
// goes through its fsdp::tp::Parallel holder on every forward (evaluation, no-grad, after
// backward); a plain member the plan names is refused by parallelize_module; a call around the
// holder after the first backward is still named in its backward ([Note: a layer called around
// its holder] in src/tp/parallelize.cpp). tp = W.
#include "dist_env.h"
#include "error_of.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

namespace fsdp_test {
namespace {

// A Megatron MLP written as public LibTorch code writes it: `->forward` on each layer.
struct ArrowMlpImpl : torch::nn::Module {
  ArrowMlpImpl() {
    up = register_module("up", torch::nn::Linear(kDim, kHidden));
    down = register_module("down", torch::nn::Linear(kHidden, kDim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down->forward(torch::relu(up->forward(x))); }
  fsdp::tp::Parallel<torch::nn::Linear> up{nullptr}, down{nullptr};
};
TORCH_MODULE(ArrowMlp);

ArrowMlp seeded_mlp() {
  torch::manual_seed(3);
  return ArrowMlp();
}

ArrowMlp split_mlp() {
  ArrowMlp mlp = seeded_mlp();
  fsdp::tp::parallelize_module(*mlp, world_tp(), {{"up", fsdp::tp::ColwiseParallel()},
                                                  {"down", fsdp::tp::RowwiseParallel()}});
  return mlp;
}

torch::Tensor input() {
  torch::manual_seed(4);
  return torch::randn({4, kDim});
}

void expect_evaluation_equal(ArrowMlp& split, ArrowMlp& whole, const char* when) {
  torch::NoGradGuard no_grad;
  split->eval();
  whole->eval();
  const torch::Tensor got = split->forward(input()), expected = whole->forward(input());
  EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6))
      << when << ": max difference " << (got - expected).abs().max().item<double>();
  split->train();
  whole->train();
}

}  // namespace

TEST(TensorParallel, ArrowForwardRunsThroughTheHolderOnEveryForward) {
  ArrowMlp whole = seeded_mlp();
  ArrowMlp split = split_mlp();
  expect_evaluation_equal(split, whole, "an evaluation before any backward");
  for (int step = 0; step < 2; ++step) {
    const torch::Tensor got = split->forward(input()), expected = whole->forward(input());
    EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6)) << "training forward " << step;
    got.sum().backward();
  }
  expect_evaluation_equal(split, whole, "an evaluation after backward");
}

TEST(TensorParallel, APlainMemberThePlanNamesIsRefusedAtParallelize) {
  // A port that named a plain torch::nn::Linear member: each of its calls would skip the all-reduce.
  struct PlainImpl : torch::nn::Module {
    PlainImpl() { fc = register_module("fc", torch::nn::Linear(kDim, kHidden)); }
    torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
    torch::nn::Linear fc{nullptr};
  };
  auto plain = std::make_shared<PlainImpl>();
  const std::string error = error_of([&] {
    fsdp::tp::parallelize_module(*plain, world_tp(), {{"fc", fsdp::tp::ColwiseParallel()}});
  });
  EXPECT_NE(error.find("'fc' (ColwiseParallel) is not held by an fsdp::tp::Parallel holder"), std::string::npos) << error;
  EXPECT_NE(error.find("fsdp::tp::Parallel<torch::nn::Linear> fc{nullptr};"), std::string::npos) << error;
}

TEST(TensorParallel, ALayerCalledAroundItsHolderAfterABackwardIsNamedInBackward) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank communicates nothing to skip";
  ArrowMlp split = split_mlp();
  split->forward(input()).sum().backward();  // through the holders: fine
  // Around the holder: LinearImpl's own forward, without the input's all-reduce in backward.
  const torch::Tensor around = split->down->forward(torch::relu(split->up.ptr()->forward(input())));
  const std::string error = error_of([&] { around.sum().backward(); });
  EXPECT_NE(error.find("'up' was called directly"), std::string::npos) << error;
}

TEST(TensorParallel, ForwardsAheadOfTheirBackwardsPassTheHolderCheckEachOnce) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank communicates nothing to skip";
  // A pipeline's micro-batches: two forwards through the holders, then their two backwards.
  ArrowMlp split = split_mlp();
  const torch::Tensor first = split->forward(input()).sum(), second = split->forward(input()).sum();
  first.backward();
  second.backward();
  // No forward left for a third backward: the call around the holder is still named.
  const torch::Tensor around = split->down->forward(torch::relu(split->up.ptr()->forward(input())));
  const std::string error = error_of([&] { around.sum().backward(); });
  EXPECT_NE(error.find("'up' was called directly"), std::string::npos) << error;
}

TEST(TensorParallel, AttentionHeadsTheTpSizeDoesNotDivideAreNamed) {
  auto tp = world_tp();
  EXPECT_EQ(fsdp::tp::local_heads(4 * tp->size(), *tp), 4);
  if (tp->size() == 1) return;
  const int t = tp->size();
  const std::string error = error_of([&] { fsdp::tp::local_heads(2 * t + 1, *tp); });
  EXPECT_NE(error.find("the tp size " + std::to_string(t) + " (--tp) does not divide the " +
                       std::to_string(2 * t + 1) + " attention heads"), std::string::npos) << error;
  const std::string kv = error_of([&] { fsdp::tp::local_heads(1, *tp, "key/value heads"); });
  EXPECT_NE(kv.find("does not divide the 1 key/value heads"), std::string::npos) << kv;
}

}  // namespace fsdp_test
