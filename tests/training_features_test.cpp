// Gradient accumulation (with and without communication) and gradient clipping across shards,
// each against unsharded training on the same large batch.
#include "dist_env.h"
#include "test_corpus.h"
#include "parity_check.h"
#include "test_models.h"

#include "data.h"
#include "trainer.h"

#include <fsdp/fused_adamw.h>

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

namespace fsdp_test {
namespace {

// fsdp::optim::StepInBackward steps each unit as its gradient lands, on the optimizer's worker
// thread, while backward goes on: the same AdamW on the same gradients, so the run equals the one
// that steps after backward bitwise, under every strategy, in fp32 and bf16, with accumulation
// (it steps only in the last micro-batch's backward). Every parameter must have moved: a unit the
// worker never stepped would be stepped by step() instead, but one stepped twice would not match.
TEST(StepInBackward, EqualsSteppingAfterBackwardBitwise) {
  using S = fsdp::ShardingStrategy;
  for (S strategy : {S::FullShard, S::ShardGradOp, S::NoShard}) {
    for (bool bf16 : {false, true}) {
      auto o = small_run();
      o.grad_accum = 2;
      o.fsdp.strategy(strategy);
      if (bf16) o.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
      SCOPED_TRACE(std::string(fsdp::to_string(strategy)) + (bf16 ? " bf16" : " fp32"));
      const auto after = gpt::train(o, &dist());
      o.step_in_backward = true;
      const auto during = gpt::train(o, &dist());
      EXPECT_EQ(during.losses, after.losses);
      ASSERT_EQ(during.final_params.size(), after.final_params.size());
      for (size_t i = 0; i < after.final_params.size(); ++i) {
        EXPECT_TRUE(torch::equal(during.final_params[i].second, after.final_params[i].second))
            << after.final_params[i].first;
      }
    }
  }
}

}  // namespace
}  // namespace fsdp_test

namespace fsdp_test {
namespace {

// The steps happen during backward, not in step(): once backward has returned and the queued
// steps are done, the parameters have moved (all but those whose gradient is exactly zero), and
// step() moves none of them again.
TEST(StepInBackward, EveryUnitIsSteppedBeforeStepIsCalled) {
  using S = fsdp::ShardingStrategy;
  for (S strategy : {S::FullShard, S::NoShard}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    auto o = small_run();
    auto model = fsdp::fully_shard(gpt::make_gpt(o.model, 1), *dist().world,
                                   fsdp::FullyShardOptions().strategy(strategy));
    auto optimizer = gpt::make_optimizer(model.module(), 1e-2, 0.1, /*fused=*/true);
    auto& fused = dynamic_cast<fsdp::optim::AdamW&>(*optimizer);
    std::vector<torch::Tensor> before;
    for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
    auto [x, y] = test_corpus().batch(3, 0, dist().rank() * o.batch, o.batch, o.model.max_seq);
    {
      fsdp::optim::StepInBackward overlap(model, fused);
      gpt::lm_loss(model(x), y).backward();
    }
    fused.wait_queued_steps();
    std::vector<torch::Tensor> stepped;
    size_t i = 0, moved = 0, held = 0;
    for (const auto& p : model->parameters()) {
      held += p.numel() > 0;
      moved += p.numel() > 0 && !torch::equal(p, before[i]);
      stepped.push_back(p.detach().clone());
      ++i;
    }
    EXPECT_GE(moved, held * 9 / 10) << "of " << held << " parameters, " << moved << " moved in backward";
    fused.step();
    i = 0;
    for (const auto& p : model->parameters()) {
      EXPECT_TRUE(torch::equal(p, stepped[i])) << "parameter " << i << " stepped twice";
      ++i;
    }
  }
}

}  // namespace
}  // namespace fsdp_test
