// The core layer (src/core) on its own: the sharding options and their checks, the flat layout of
// a unit's parameters, the unit holder.
#include <fsdp/fsdp.h>

#include "core/flat_param.h"

#include <gtest/gtest.h>

#include "error_of.h"

namespace {

using fsdp_test::error_of;

TEST(Options, UnknownStrategyNamesTheValueAndTheChoices) {
  const std::string message = error_of([] { fsdp::parse_sharding_strategy("fulll"); });
  EXPECT_NE(message.find("'fulll'"), std::string::npos) << message;
  EXPECT_NE(message.find("'full'"), std::string::npos) << message;
  EXPECT_EQ(fsdp::parse_sharding_strategy("full"), fsdp::ShardingStrategy::FullShard);
}

TEST(Options, BadShardingOptionsNameTheValueAndTheFix) {
  using S = fsdp::ShardingStrategy;
  auto hybrid = [](int f) { return fsdp::FullyShardOptions().strategy(S::HybridShard).shard_group_size(f); };
  std::string message = error_of([&] { hybrid(3).validate(4); });
  EXPECT_NE(message.find("shard group size 3 does not divide the world size 4"), std::string::npos)
      << message;
  message = error_of([&] { hybrid(2).validate(2); });
  EXPECT_NE(message.find("single replica group"), std::string::npos) << message;
  EXPECT_NE(message.find("'full'"), std::string::npos) << message;
  message = error_of([&] { fsdp::FullyShardOptions().shard_group_size(2).validate(4); });
  EXPECT_NE(message.find("hybrid strategies only"), std::string::npos) << message;
  message = error_of([&] { fsdp::FullyShardOptions().limit_all_gathers(-1).validate(4); });
  EXPECT_NE(message.find("limit_all_gathers(-1)"), std::string::npos) << message;
  EXPECT_EQ(error_of([&] { hybrid(2).validate(4); }), "");
  EXPECT_EQ(hybrid(2).shard_group_size_for(4), 2);
  EXPECT_EQ(fsdp::FullyShardOptions().strategy(S::NoShard).shard_group_size_for(4), 1);
  EXPECT_EQ(fsdp::FullyShardOptions().strategy(S::ShardGradOp).shard_group_size_for(4), 4);
  // The hybrid default: the ranks of one host, as the world group learnt them at init (never read
  // from the environment at use); unknown, the whole world.
  EXPECT_EQ(hybrid(0).shard_group_size_for(8, 2), 2);
  EXPECT_EQ(hybrid(0).shard_group_size_for(8), 8);
  EXPECT_EQ(hybrid(4).shard_group_size_for(8, 2), 4);
  EXPECT_EQ(error_of([&] { hybrid(0).validate(4, 2); }), "");
  message = error_of([&] { hybrid(0).validate(4, 3); });
  EXPECT_NE(message.find("shard group size 3 does not divide"), std::string::npos) << message;
  for (const char* name : {"full", "grad_op", "none", "hybrid", "hybrid_grad_op"}) {
    EXPECT_STREQ(fsdp::to_string(fsdp::parse_sharding_strategy(name)), name);
  }
}

TEST(Options, DtypesThatCannotBeReducedAreRejectedNamingThem) {
  auto with = [](fsdp::MixedPrecision mp) { return fsdp::FullyShardOptions().mixed_precision(mp); };
  std::string message =
      error_of([&] { with(fsdp::MixedPrecision().param_dtype(at::kInt)).validate(2); });
  EXPECT_NE(message.find("param_dtype(Int)"), std::string::npos) << message;
  EXPECT_NE(message.find("at::kBFloat16"), std::string::npos) << message;
  message = error_of(
      [&] { with(fsdp::MixedPrecision().reduce_dtype(at::kFloat8_e4m3fn)).validate(2); });
  EXPECT_NE(message.find("reduce_dtype(Float8_e4m3fn)"), std::string::npos) << message;
  message = error_of([&] { with(fsdp::MixedPrecision().buffer_dtype(at::kBool)).validate(2); });
  EXPECT_NE(message.find("buffer_dtype(Bool)"), std::string::npos) << message;
  EXPECT_EQ(error_of([&] {
              with(fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat))
                  .validate(2);
            }),
            "");
  message = error_of([] { fsdp::parse_dtype("bfloat"); });
  EXPECT_NE(message.find("'bfloat'"), std::string::npos) << message;
  EXPECT_EQ(fsdp::parse_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(fsdp::parse_dtype("fp16"), at::kHalf);
}

// bf16 compute with fp32 reduction: the unsharded gradient is fp32 from the start, each bf16
// gradient cast exactly as it is copied in (the reduction then converts nothing); at W = 1 the
// gradients can go straight into the fp32 gradient shard, with no unsharded gradient at all.
TEST(FlatParam, GradientsAreKeptInTheReductionDtype) {
  for (const bool into_shard : {false, true}) {
    std::vector<std::pair<std::string, at::Tensor>> params{
        {"w", torch::zeros({3, 4}).requires_grad_()}, {"b", torch::zeros({5}).requires_grad_()}};
    fsdp::FlatParam flat(params, 0, 1, at::kBFloat16, std::nullopt, at::kFloat);
    EXPECT_EQ(flat.full_grad().scalar_type(), at::kFloat);
    flat.begin_full_grad(/*keep=*/false, into_shard);
    EXPECT_EQ(flat.grads_in_shard(), into_shard);
    const auto grad = (torch::randn({3, 4}) * 1e3).to(at::kBFloat16);
    flat.entries()[0].param.mutable_grad() = grad;
    flat.take_grad(0);
    flat.complete_full_grad();
    const at::Tensor sum = into_shard ? flat.grad_shard() : flat.full_grad();
    EXPECT_TRUE(torch::equal(sum.narrow(0, 0, 12).view({3, 4}), grad.to(at::kFloat)));
    EXPECT_TRUE(torch::equal(sum.narrow(0, 12, 5), torch::zeros({5})));  // no gradient: zero
    // Into the shard: the unsharded gradient's storage was never allocated.
    EXPECT_EQ(flat.full_grad().storage().nbytes() == 0, into_shard);
  }
}

TEST(FlatParam, ShardsPartitionEveryParameterForAnyWorldSize) {
  for (int world : {1, 2, 3, 5}) {
    std::vector<int64_t> covered(4, 0);
    const std::vector<int64_t> sizes{7, 1, 0, 12};
    int64_t shard_numel = 0;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (size_t i = 0; i < sizes.size(); ++i) {
        params.emplace_back("p" + std::to_string(i), torch::arange(sizes[i], torch::kFloat));
      }
      fsdp::FlatParam flat(params, rank, world);
      shard_numel = flat.shard_numel();
      EXPECT_EQ(flat.padded_numel() % world, 0);
      EXPECT_EQ(flat.numel(), 20);
      EXPECT_LT(flat.padded_numel() - flat.numel(), world);  // padding < W elements
      for (size_t i = 0; i < sizes.size(); ++i) {
        const auto& e = flat.entries()[i];
        covered[i] += e.shard_end - e.shard_begin;
        // The parameter now is its piece of the shard, with the right values.
        EXPECT_EQ(e.param.numel(), e.shard_end - e.shard_begin);
        if (e.param.numel() > 0) {
          const int64_t first = rank * shard_numel + e.shard_begin - e.offset;
          EXPECT_EQ(e.param[0].item<float>(), static_cast<float>(first));
        }
      }
    }
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(covered[i], sizes[i]) << "world " << world;
    EXPECT_EQ(shard_numel, (20 + world - 1) / world);
  }
}

TEST(Unit, IsAPassThroughUntilSharded) {
  torch::manual_seed(0);
  torch::nn::Linear linear(3, 2);
  fsdp::Unit<torch::nn::Linear> unit(linear);
  auto x = torch::randn({4, 3});
  EXPECT_FALSE(unit.is_sharded());
  EXPECT_TRUE(torch::equal(unit(x), linear(x)));
  EXPECT_TRUE(unit.units().empty());
}

}  // namespace
