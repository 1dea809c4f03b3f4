// Activation checkpointing of units: the same training, bit for bit, with the same bytes moved
// (FSDP's hooks do not fire twice), and less activation memory.
#include "dist_env.h"
#include "parity_check.h"

#include "trainer.h"

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

TEST(ActivationCheckpointing, TrainsBitwiseTheSameAndMovesTheSameBytes) {
  auto o = tiny_gpt_run(/*layers=*/2, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/3);
  auto run = [&](bool checkpointing) {
    o.fsdp.activation_checkpointing(checkpointing);
    const auto before = fsdp::comm_stats();
    auto result = gpt::train(o, &dist());
    const auto after = fsdp::comm_stats();
    return std::make_tuple(result, after.all_gather_bytes - before.all_gather_bytes,
                           after.reduce_scatter_bytes - before.reduce_scatter_bytes);
  };
  const auto [plain, plain_gathered, plain_reduced] = run(false);
  const auto [recomputed, gathered, reduced] = run(true);
  EXPECT_EQ(recomputed.losses, plain.losses);
  for (size_t i = 0; i < plain.final_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(recomputed.final_params[i].second, plain.final_params[i].second))
        << plain.final_params[i].first;
  }
  EXPECT_EQ(gathered, plain_gathered);
  EXPECT_EQ(reduced, plain_reduced);
}

// Peak tensor memory of one training step, above what is allocated before it.
int64_t step_peak_bytes(bool checkpointing) {
  const auto config = gpt::GPTConfig::sized(/*layers=*/4, /*dim=*/64, /*heads=*/4, /*max_seq=*/128);
  auto model = fsdp::fully_shard(gpt::make_gpt(config, 7), *dist().world,
                                 fsdp::FullyShardOptions().activation_checkpointing(checkpointing));
  auto tokens = torch::randint(0, 256, {8, config.max_seq + 1}, torch::kLong);
  const int64_t base = fsdp::memory_stats().current_bytes;
  fsdp::reset_peak_memory();
  gpt::lm_loss(model(tokens.narrow(1, 0, config.max_seq)), tokens.narrow(1, 1, config.max_seq))
      .backward();
  return fsdp::memory_stats().peak_bytes - base;
}

TEST(ActivationCheckpointing, LowersPeakActivationMemory) {
  const int64_t plain = step_peak_bytes(false);
  const int64_t recomputed = step_peak_bytes(true);
  std::printf("peak above the sharded model, 4 x GPT block dim 64, 8 x 128 tokens: without %.2f MiB, "
              "with activation checkpointing %.2f MiB (%.2fx)\n",
              plain / 1048576.0, recomputed / 1048576.0, double(recomputed) / plain);
  // Each block keeps ~20 activations of [8, 128, 64] (and the attention's [8, 4, 128, 128]);
  // checkpointed it keeps its input alone, and one block's activations exist at a time.
  EXPECT_LT(recomputed, plain / 2);
}

}  // namespace
}  // namespace fsdp_test
