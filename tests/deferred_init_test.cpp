// Deferred initialisation: a model built and sharded unit by unit never exists whole on a rank,
// and ends up exactly as the same model built whole and then sharded.
#include "dist_env.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace fsdp_test {
namespace {

constexpr int64_t kSlabs = 8, kWidth = 256;

struct SlabImpl : torch::nn::Module {
  SlabImpl() { fc = register_module("fc", torch::nn::Linear(kWidth, kWidth)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Slab);

struct TowerImpl : torch::nn::Module {
  TowerImpl() {
    for (int64_t i = 0; i < kSlabs; ++i) {
      slabs.emplace_back(register_module("slab" + std::to_string(i), Slab()));  // sharded here
    }
    head = register_module("head", torch::nn::Linear(kWidth, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& slab : slabs) x = slab(x);
    return head(x);
  }
  std::vector<fsdp::Unit<Slab>> slabs;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Tower);

Tower build_tower() {
  torch::manual_seed(21);
  return Tower();
}

constexpr int64_t kUnitBytes = 4 * (kWidth * kWidth + kWidth);
constexpr int64_t kRootBytes = 4 * (2 * kWidth + 2);

TEST(DeferredInit, PeakIsTheShardedModelPlusOneUnitAndTheResultEqualsEagerSharding) {
  const int64_t before = fsdp::memory_stats().current_bytes;
  fsdp::reset_peak_memory();
  auto deferred = fsdp::fully_shard_deferred(build_tower, *dist().world);
  const int64_t peak = fsdp::memory_stats().peak_bytes - before;
  const int64_t sharded = fsdp::memory_stats().current_bytes - before;
  const int64_t whole = kSlabs * kUnitBytes + kRootBytes;
  // The test's budget: the sharded model, one unit being built, and the root's own parameters
  // (built whole before the root is sharded). The whole model does not fit in it (W >= 2).
  const int64_t budget = sharded + kUnitBytes + kRootBytes;
  std::printf("set-up peak %lld B (sharded model %lld B + one unit %lld B + root %lld B = %lld B); "
              "the whole model is %lld B\n", (long long)peak, (long long)sharded,
              (long long)kUnitBytes, (long long)kRootBytes, (long long)budget, (long long)whole);
  EXPECT_LE(peak, budget);
  if (dist().world_size() > 1) {
    EXPECT_GT(whole, budget);
  }

  // Same random numbers in the same order: the shards are those of the model built whole.
  auto eager = fsdp::fully_shard(build_tower(), *dist().world);
  const auto expected = fsdp::gather_full_params(eager);
  const auto actual = fsdp::gather_full_params(deferred);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first);
    EXPECT_TRUE(torch::equal(actual[i].second, expected[i].second)) << expected[i].first;
  }
  auto x = torch::randn({2, kWidth});
  EXPECT_TRUE(torch::equal(deferred(x), eager(x)));
}

TEST(DeferredInit, InitialisesEachParameterBeforeShardingAndCanTakeRankZerosValues) {
  // Every rank seeds differently: sync_module_states makes them agree, unit by unit.
  auto init = [](const std::string& name, torch::Tensor& p) {
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      p.fill_(0.5);
    } else {
      p.normal_(0.0, 0.02);
    }
  };
  auto build_with_seed = [&](uint64_t seed, bool sync) {
    return fsdp::fully_shard_deferred(
        [seed] {
          torch::manual_seed(seed);
          return Tower();
        },
        *dist().world, fsdp::FullyShardOptions().sync_module_states(sync), init);
  };
  auto model = build_with_seed(100 + dist().rank(), /*sync=*/true);
  const auto params = fsdp::gather_full_params(model);
  ASSERT_EQ(params.size(), static_cast<size_t>(2 * kSlabs + 2));
  EXPECT_EQ(params.front().first, "head.weight");  // the root unit comes first
  EXPECT_EQ(params.back().first, "slab7.fc.bias");
  for (const auto& [name, tensor] : params) {
    if (name.find("bias") != std::string::npos) {
      EXPECT_TRUE(torch::all(tensor == 0.5).item<bool>()) << name;
    } else {
      EXPECT_LT(tensor.std().item<double>(), 0.03) << name;
    }
  }
  // Rank 0's values everywhere, bitwise: the model every rank builds from rank 0's seed. (Each
  // rank's own shard is what it holds; without the broadcast, rank r > 0's shards would be those
  // of seed 100 + r, and the gathered model a mixture.)
  auto from_rank0_seed = build_with_seed(100, /*sync=*/false);
  const auto expected = fsdp::gather_full_params(from_rank0_seed);
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, expected[i].first);
    EXPECT_TRUE(torch::equal(params[i].second, expected[i].second)) << expected[i].first;
  }
  // And the sharded model computes what rank 0's model computes.
  auto x = torch::randn({2, kWidth}, at::detail::createCPUGenerator(7));
  EXPECT_TRUE(torch::equal(model(x), from_rank0_seed(x)));
}

}  // namespace
}  // namespace fsdp_test
