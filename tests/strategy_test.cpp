// Every sharding strategy trains the GPT like unsharded training on the same global batch, and
// moves exactly the bytes of DESIGN.md's formulas through each kind of collective.
#include "dist_env.h"
#include "parity_check.h"

#include "data.h"
#include "trainer.h"

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

// The largest shard group with at least two replicas (F = 1 when W is prime), 0 if none.
int hybrid_shard_group_size(int world) {
  for (int f = world / 2; f >= 1; --f) {
    if (world % f == 0) return f;
  }
  return 0;
}

std::vector<fsdp::FullyShardOptions> strategies_for(int world) {
  using S = fsdp::ShardingStrategy;
  std::vector<fsdp::FullyShardOptions> all;
  for (S s : {S::FullShard, S::ShardGradOp, S::NoShard}) all.push_back(fsdp::FullyShardOptions().strategy(s));
  if (int f = hybrid_shard_group_size(world)) {
    for (S s : {S::HybridShard, S::HybridShardGradOp}) {
      all.push_back(fsdp::FullyShardOptions().strategy(s).shard_group_size(f));
    }
  }
  return all;
}

gpt::TrainOptions tiny_run() {
  return tiny_gpt_run(/*layers=*/3, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/4);
}

TEST(Strategy, EveryStrategyMatchesTheUnshardedReference) {
  auto o = tiny_run();
  o.reference_world_size = dist().world_size();
  const auto reference = gpt::train(o, nullptr);
  for (const auto& options : strategies_for(dist().world_size())) {
    SCOPED_TRACE(fsdp::to_string(options.strategy()));
    o.fsdp = options;
    const auto sharded = gpt::train(o, &dist());
    expect_same_losses(sharded.losses, reference.losses);
    expect_same_params(sharded.final_params, as_map(reference.final_params), o.lr * o.steps);
  }
}

// Mixed precision under every strategy (NO_SHARD's unshard is a cast without a collective;
// hybrid reduces in bf16 across the replicas too), against the bf16 reference: bf16 tolerances.
TEST(Strategy, EveryStrategyInBf16MatchesTheBf16Reference) {
  auto o = tiny_run();
  o.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
  o.reference_world_size = dist().world_size();
  const auto reference = gpt::train(o, nullptr);
  const LowPrecisionTolerance tol{1.0 / 256};
  for (auto options : strategies_for(dist().world_size())) {
    SCOPED_TRACE(fsdp::to_string(options.strategy()));
    o.fsdp = options.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
    const auto sharded = gpt::train(o, &dist());
    expect_losses_within(sharded.losses, reference.losses, tol.loss_rel(), fsdp::to_string(options.strategy()));
    expect_params_within(sharded.final_params, as_map(reference.final_params), 2 * o.lr * o.steps,
                         tol.mean_param_diff(o));
  }
}

TEST(Strategy, BytesPerCollectiveMatchTheFormulas) {
  const int w = dist().world_size();
  static const auto corpus = gpt::ByteCorpus::load(corpus_dir(), 1 << 20, 64);
  auto [x, y] = corpus.batch(5, 0, dist().rank() * 2, 2, 16);
  for (const auto& options : strategies_for(w)) {
    SCOPED_TRACE(fsdp::to_string(options.strategy()));
    auto o = tiny_run();
    auto model = fsdp::fully_shard(gpt::make_gpt(o.model, 1), *dist().world, options);
    const int64_t f = options.shard_group_size_for(w), r = w / f;
    const bool regather = fsdp::reshards_after_forward(options.strategy());
    int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
    for (const auto& unit : model.units()) {
      const int64_t shard = unit.shard_numel * unit.element_size;
      const int64_t gathers = unit.is_root || !regather ? 1 : 2;  // forward (+ backward)
      all_gather += gathers * (f - 1) * shard;                    // Ψ_i (F-1)/F per gather
      reduce_scatter += (f - 1) * shard;                          // Ψ_i (F-1)/F
      all_reduce += 2 * (r - 1) * shard / r;                      // 2 (Ψ_i/F) (R-1)/R
    }
    const auto before = fsdp::comm_stats();
    gpt::lm_loss(model(x), y).backward();
    const auto after = fsdp::comm_stats();
    EXPECT_EQ(after.all_gather_bytes - before.all_gather_bytes, all_gather);
    EXPECT_EQ(after.reduce_scatter_bytes - before.reduce_scatter_bytes, reduce_scatter);
    EXPECT_EQ(after.all_reduce_bytes - before.all_reduce_bytes, all_reduce);
    std::printf("%s (F=%lld, R=%lld): all-gather %lld, reduce-scatter %lld, all-reduce %lld bytes\n",
                fsdp::to_string(options.strategy()), (long long)f, (long long)r,
                (long long)all_gather, (long long)reduce_scatter, (long long)all_reduce);
  }
}

TEST(Strategy, ShardGradOpKeepsUnitsUnshardedUntilBackward) {
  auto o = tiny_run();
  auto options = fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::ShardGradOp);
  auto model = fsdp::fully_shard(gpt::make_gpt(o.model, 1), *dist().world, options);
  auto x = torch::zeros({1, 16}, torch::kLong);
  auto logits = model(x);
  // Between forward and backward the blocks' parameters have their full shapes.
  EXPECT_EQ(model->h[0]->attn->c_attn->weight.sizes(), torch::IntArrayRef({96, 32}));
  logits.sum().backward();
  if (dist().world_size() > 1) EXPECT_EQ(model->h[0]->attn->c_attn->weight.dim(), 1);
}

}  // namespace
}  // namespace fsdp_test
