// Same start on every rank: fully_shard refuses ranks whose initial parameter values differ
// (LibTorch seeds each process at random), on every rank and naming the parameter, unless
// sync_module_states takes rank 0's.
#include "dist_env.h"
#include "error_of.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <chrono>

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

// sync_module_states with ranks seeded apart: BadInput.SyncModuleStatesTakesRankZerosInitialisation.

TEST(InitialValues, DeferredUnitsBuiltDifferentlyPerRankAreRefused) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::string message = error_of([] {
    fsdp::fully_shard_deferred([] { return odd_net_seeded_per_rank(); }, *dist().world);
  });
  EXPECT_NE(message.find("differ across ranks"), std::string::npos) << message;
  EXPECT_NE(message.find("weight"), std::string::npos) << message;
}

}  // namespace
}  // namespace fsdp_test
