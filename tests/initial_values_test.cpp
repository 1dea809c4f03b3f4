// Same start on every rank: fully_shard refuses ranks whose initial parameter values differ
// (LibTorch seeds each process at random), on every rank and naming the parameter, unless
// sync_module_states takes rank 0's.
#include "dist_env.h"
#include "error_of.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <torch/data/samplers/distributed.h>

#include <chrono>
#include <limits>

namespace fsdp_test {
namespace {

// What an unseeded program does: every rank draws its own initial values.
OddNet odd_net_seeded_per_rank() { return make_odd_net(500 + dist().rank()); }

TEST(InitialValues, ModelsBuiltDifferentlyPerRankAreRefusedOnEveryRankNamingTheParameter) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([] { fsdp::fully_shard(odd_net_seeded_per_rank(), *dist().world); });
  EXPECT_NE(message.find("initial values of parameter 'head.weight' differ across ranks"),
            std::string::npos) << message;  // the first parameter: the root unit's come first
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("torch::manual_seed(0)"), std::string::npos) << message;
  EXPECT_NE(message.find("sync_module_states"), std::string::npos) << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(InitialValues, OneValueChangedOnTheLastRankIsNamedWithThatRankOnly) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  OddNet net = make_odd_net(7);
  if (dist().rank() == dist().world_size() - 1) {
    torch::NoGradGuard no_grad;
    net->second->weight[0][0].add_(1e-3);
  }
  const std::string message = error_of([&] { fsdp::fully_shard(net, *dist().world); });
  EXPECT_NE(message.find("parameter 'second.weight' differ across ranks (rank " +
                         std::to_string(dist().world_size() - 1) + " against rank 0)"),
            std::string::npos) << message;
}

TEST(InitialValues, TheSameSeedOnEveryRankPasses) {
  auto model = fsdp::fully_shard(make_odd_net(7), *dist().world);
  EXPECT_TRUE(model.is_sharded());
}

// A model whose one weight is square: its transpose has the same sum and sum of squares.
struct SquareNetImpl : torch::nn::Module {
  SquareNetImpl() { fc = register_module("fc", torch::nn::Linear(6, 6)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SquareNet);

TEST(InitialValues, IdenticalModelsHoldingNanInfOrValuesNearTheFloatMaximumPass) {
  OddNet net = make_odd_net(7);
  {
    torch::NoGradGuard no_grad;  // the same on every rank: a masked weight, an overflow sentinel
    auto w = net->second->weight;
    w[0][0] = std::numeric_limits<float>::quiet_NaN();
    w[0][1] = std::numeric_limits<float>::infinity();
    w[0][2] = -std::numeric_limits<float>::infinity();
    w[1].fill_(3e38f);
    w[2].fill_(-3.3e38f);
  }
  const std::string message = error_of([&] { fsdp::fully_shard(net, *dist().world); });
  EXPECT_EQ(message, "");
}

TEST(InitialValues, TheTransposeOfASquareWeightOnOneRankIsRefused) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  torch::manual_seed(3);
  SquareNet net;
  if (dist().rank() == 1) {
    torch::NoGradGuard no_grad;
    net->fc->weight.copy_(net->fc->weight.t().clone());
  }
  const std::string message = error_of([&] { fsdp::fully_shard(net, *dist().world); });
  EXPECT_NE(message.find("parameter 'fc.weight' differ across ranks (rank 1 against rank 0)"),
            std::string::npos) << message;
}

TEST(InitialValues, ANanOnOneRankOnlyIsRefused) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  OddNet net = make_odd_net(7);
  if (dist().rank() == 1) {
    torch::NoGradGuard no_grad;
    net->first->bias[4] = std::numeric_limits<float>::quiet_NaN();
  }
  const std::string message = error_of([&] { fsdp::fully_shard(net, *dist().world); });
  EXPECT_NE(message.find("parameter 'first.bias' differ across ranks (rank 1 against rank 0)"),
            std::string::npos) << message;
}

// sync_module_states with ranks seeded apart: BadInput.SyncModuleStatesTakesRankZerosInitialisation.

TEST(InitialValues, DeferredUnitsBuiltDifferentlyPerRankAreRefused) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::string message = error_of([] {
    fsdp::fully_shard_deferred([] { return odd_net_seeded_per_rank(); }, *dist().world);
  });
  EXPECT_NE(message.find("differ across ranks"), std::string::npos) << message;
  EXPECT_NE(message.find("weight"), std::string::npos) << message;
}

// README's seeding (the same seed on every rank before building the model) also gives every rank
// the same noise; its recipe, `torch::manual_seed(seed + rank)` right after fully_shard, gives
// each rank its own dropout while the model started equal and the data sampler stays shared.
torch::Tensor same_on_every_rank(const torch::Tensor& t) {
  auto root = t.clone();
  fsdp::broadcast(*dist().world, root, 0);
  return torch::equal(root, t) ? torch::ones({1}) : torch::zeros({1});
}

bool equal_on_every_rank(const torch::Tensor& t) {
  auto votes = same_on_every_rank(t);
  fsdp::all_reduce_sum(*dist().world, votes);
  return votes.item<float>() == dist().world_size();
}

torch::Tensor dropout_mask() { return torch::dropout(torch::ones({4096}), 0.5, /*train=*/true); }

TEST(InitialValues, ReseedingPerRankAfterFullyShardGivesEachRankItsOwnDropout) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const uint64_t seed = 0;
  torch::manual_seed(seed);  // README: the same initial model on every rank
  OddNet net;
  std::vector<torch::Tensor> initial;
  for (const auto& p : net->parameters()) initial.push_back(p.detach().flatten().clone());
  auto model = fsdp::fully_shard(net, *dist().world);
  EXPECT_TRUE(equal_on_every_rank(torch::cat(initial)));
  EXPECT_TRUE(equal_on_every_rank(dropout_mask())) << "README's seeding alone: the same noise";

  torch::manual_seed(seed + dist().rank());  // README: each rank its own generator
  EXPECT_FALSE(equal_on_every_rank(dropout_mask()));
  // A sampler seeded by itself (by the epoch) still deals every row to exactly one rank.
  const size_t rows = 60;  // divides among 1 to 4 ranks
  torch::data::samplers::DistributedRandomSampler sampler(rows, dist().world_size(), dist().rank());
  auto dealt = torch::zeros({static_cast<int64_t>(rows)});
  const auto indices = sampler.next(rows).value();
  for (size_t index : indices) dealt[static_cast<int64_t>(index)] += 1;
  fsdp::all_reduce_sum(*dist().world, dealt);
  EXPECT_TRUE(torch::equal(dealt, torch::ones_like(dealt)));
}

}  // namespace
}  // namespace fsdp_test
