// Gradient accumulation (with and without communication) and gradient clipping across shards,
// each against unsharded training on the same large batch.
#include "dist_env.h"
#include "parity_check.h"
#include "test_models.h"

#include "trainer.h"

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

gpt::TrainOptions small_run() {
  return tiny_gpt_run(/*layers=*/2, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/3);
}

// Two micro-batches of B rows per rank equal one step on the large batch of 2·W·B rows.
void expect_accumulation_matches_large_batch(bool no_sync) {
  auto o = small_run();
  o.grad_accum = 2;
  o.no_sync = no_sync;
  const auto before = fsdp::comm_stats();
  const auto sharded = gpt::train(o, &dist());
  const auto reduce_scatter_bytes = fsdp::comm_stats().reduce_scatter_bytes - before.reduce_scatter_bytes;

  auto large = small_run();
  large.batch = 2 * o.batch;  // rows [0, 2·W·B): the same rows as the two micro-batches
  large.reference_world_size = dist().world_size();
  const auto reference = gpt::train(large, nullptr);
  expect_same_losses(sharded.losses, reference.losses);
  expect_same_params(sharded.final_params, as_map(reference.final_params), o.lr * o.steps);

  // With no_sync the gradient is reduced once per step, not once per micro-batch.
  auto single = small_run();
  const auto single_before = fsdp::comm_stats().reduce_scatter_bytes;
  gpt::train(single, &dist());
  const auto per_step = (fsdp::comm_stats().reduce_scatter_bytes - single_before) / single.steps;
  EXPECT_EQ(reduce_scatter_bytes, (no_sync ? 1 : 2) * per_step * o.steps);
}

TEST(Training, GradientAccumulationWithCommunicationEqualsTheLargeBatch) {
  expect_accumulation_matches_large_batch(/*no_sync=*/false);
}

TEST(Training, GradientAccumulationWithoutCommunicationEqualsTheLargeBatch) {
  expect_accumulation_matches_large_batch(/*no_sync=*/true);
}

TEST(Training, ClippedTrainingMatchesTheReference) {
  auto o = small_run();
  o.clip = 0.05;  // below the gradient norms of these steps: clipping is active
  const auto sharded = gpt::train(o, &dist());
  o.reference_world_size = dist().world_size();
  const auto reference = gpt::train(o, nullptr);
  expect_same_losses(sharded.losses, reference.losses);
  expect_same_params(sharded.final_params, as_map(reference.final_params), o.lr * o.steps);
}

TEST(Training, GlobalGradientNormEqualsTheUnshardedNormForEveryStrategy) {
  using S = fsdp::ShardingStrategy;
  const int world = dist().world_size(), rank = dist().rank();
  for (S strategy : {S::FullShard, S::ShardGradOp, S::NoShard}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    OddNet reference = make_odd_net(8);
    auto model = fsdp::fully_shard(make_odd_net(8), *dist().world,
                                   fsdp::FullyShardOptions().strategy(strategy));
    auto [x, y] = odd_batch(0, 3 * world);
    torch::mse_loss(reference(x), y).backward();
    torch::mse_loss(model(x.narrow(0, 3 * rank, 3)), y.narrow(0, 3 * rank, 3)).backward();
    const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.01);
    const double norm = fsdp::clip_grad_norm_(model, 0.01);
    EXPECT_NEAR(norm, expected, 1e-5 * expected);
    // After clipping, the sharded gradients' global norm is the limit.
    EXPECT_NEAR(fsdp::clip_grad_norm_(model, 1e9), 0.01, 1e-6);
  }
}

}  // namespace
}  // namespace fsdp_test
