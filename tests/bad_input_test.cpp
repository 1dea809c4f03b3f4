// Bad input across ranks gives a clear error on every rank, within the timeout, never a hang.
#include "dist_env.h"
#include "test_models.h"

#include "gpt.h"

#include <gtest/gtest.h>

#include <chrono>

namespace fsdp_test {
namespace {

TEST(BadInput, DifferentModelsFailOnEveryRankNamingTheParameter) {
  if (dist().world_size() < 2) GTEST_SKIP() << "needs two ranks";
  gpt::GPTConfig config;
  config.layers = 2;
  config.dim = 32;
  config.heads = 2;
  config.max_seq = 16;
  if (dist().rank() == 1) config.dim = 48;  // rank 1 was started with another configuration
  auto model = gpt::make_gpt(config, 1);
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

}  // namespace
}  // namespace fsdp_test
