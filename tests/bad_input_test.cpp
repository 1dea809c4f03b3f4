// Bad input across ranks gives a clear error on every rank, within the timeout, never a hang.
#include "dist_env.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>

namespace fsdp_test {
namespace {

// A byte embedding of width `dim` and a block (one unit), as a language model starts.
struct EmbedderImpl : torch::nn::Module {
  explicit EmbedderImpl(int64_t dim) {
    wte = register_module("wte", torch::nn::Embedding(256, dim));
    block = register_module("block", torch::nn::Linear(dim, dim));
    block_unit = block;
  }
  torch::Tensor forward(const torch::Tensor& idx) { return block_unit(wte(idx)); }
  torch::nn::Embedding wte{nullptr};
  torch::nn::Linear block{nullptr};
  fsdp::Unit<torch::nn::Linear> block_unit;
};
TORCH_MODULE(Embedder);

TEST(BadInput, DifferentModelsFailOnEveryRankNamingTheParameter) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t dim = dist().rank() == 1 ? 48 : 32;  // rank 1 was started with another width
  Embedder model(dim);
  const auto start = std::chrono::steady_clock::now();
  try {
    auto sharded = fsdp::fully_shard(model, *dist().world);
    FAIL() << "fully_shard accepted different models";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("differs across ranks"), std::string::npos) << message;
    EXPECT_NE(message.find("wte.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("[256, 32]"), std::string::npos) << message;
    EXPECT_NE(message.find("[256, 48]"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(BadInput, ExtraParameterOnOneRankIsNamed) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  OddNet net = make_odd_net(1);
  if (dist().rank() == dist().world_size() - 1) {
    net->register_parameter("surprise", torch::zeros({2}));
  }
  try {
    fsdp::fully_shard(net, *dist().world);
    FAIL() << "fully_shard accepted different models";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("surprise"), std::string::npos)
        << e.what_without_backtrace();
  }
}

struct TwoBranchesImpl : torch::nn::Module {
  TwoBranchesImpl() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    a_unit = a;
    b_unit = b;
  }
  torch::Tensor forward(const torch::Tensor& x, bool swap) {
    return swap ? a_unit(b_unit(x)) : b_unit(a_unit(x));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  fsdp::Unit<torch::nn::Linear> a_unit, b_unit;
};
TORCH_MODULE(TwoBranches);

TEST(BadInput, ExecutionOrderThatDiffersAcrossRanksIsNamed) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  torch::manual_seed(0);
  auto model = fsdp::fully_shard(TwoBranches(), *dist().world,
                                 fsdp::FullyShardOptions().check_execution_order(true));
  const bool swap = dist().rank() == 1;  // rank-dependent control flow around units
  try {
    model(torch::ones({2, 8}), swap).sum().backward();
    FAIL() << "a different execution order went unnoticed";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("execution order differs"), std::string::npos) << message;
    EXPECT_NE(message.find("'a'"), std::string::npos) << message;
    EXPECT_NE(message.find("'b'"), std::string::npos) << message;
  }
}

TEST(BadInput, BuffersAreTakenFromRankZero) {
  OddNet net = make_odd_net(1);
  const auto expected = net->shift_unit->shift.clone();
  {
    torch::NoGradGuard no_grad;
    net->shift_unit->shift.add_(dist().rank());  // ranks disagree before sharding
  }
  auto model = fsdp::fully_shard(net, *dist().world);
  EXPECT_TRUE(torch::equal(net->shift_unit->shift, expected));
}

TEST(BadInput, SyncModuleStatesTakesRankZerosInitialisation) {
  OddNet reference = make_odd_net(1);  // what rank 0 builds
  OddNet net = make_odd_net(1 + dist().rank());  // every rank seeds differently
  auto model = fsdp::fully_shard(net, *dist().world,
                                 fsdp::FullyShardOptions().sync_module_states(true));
  const auto params = reference->named_parameters(), buffers = reference->named_buffers();
  for (const auto& [name, tensor] : fsdp::gather_full_params(model)) {  // parameters, then buffers
    const torch::Tensor* expected = params.find(name) ? params.find(name) : buffers.find(name);
    ASSERT_NE(expected, nullptr) << "unexpected " << name;
    EXPECT_TRUE(torch::equal(tensor, *expected)) << name;
  }
}

// One step of `optimizer` on the awkward model's rows (every rank the same rows).
void odd_step(torch::optim::Optimizer& optimizer, const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  auto [x, y] = odd_batch(0, 4);
  optimizer.zero_grad();
  torch::mse_loss(forward(x), y).backward();
  optimizer.step();
}

// The library's optimizers built and stepped before fully_shard hold state of the whole shapes:
// the next step names the cause and the fix, not ATen's "size of tensor a must match".
template <class Optimizer, class Options>
void expect_stepped_before_shard_is_named(const Options& options, const char* optimizer_name) {
  OddNet net = make_odd_net(1);
  Optimizer optimizer(net->parameters(), options);
  odd_step(optimizer, [&](const torch::Tensor& x) { return net(x); });
  auto model = fsdp::fully_shard(net, *dist().world);
  try {
    odd_step(optimizer, [&](const torch::Tensor& x) { return model(x); });
    FAIL() << optimizer_name << " stepped state of the whole shapes on the shards";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find(optimizer_name), std::string::npos) << message;
    EXPECT_NE(message.find("build the optimizer after fully_shard"), std::string::npos) << message;
  }
}

TEST(BadInput, AnOptimizerThatSteppedBeforeFullyShardIsNamed) {
  if (dist().world_size() < 2) GTEST_SKIP() << "one rank keeps each parameter whole, in its shape";
  expect_stepped_before_shard_is_named<fsdp::optim::AdamW>(torch::optim::AdamWOptions(1e-3),
                                                           "fsdp::optim::AdamW");
  expect_stepped_before_shard_is_named<fsdp::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9),
                                                         "fsdp::optim::SGD");
}

}  // namespace
}  // namespace fsdp_test
