// The planner's TP collectives are the styles' own descriptions ([Note: a style's two readers]):
// a block's are what the family's ParallelizePlan's styles move (fsdp::tp::moves_of) over the
// layer table, so a plan changed changes the planned bytes with no planner edit.
#include "gpt_plan.h"
#include "plan_tp_moves.h"
#include "tensor_parallel_plan.h"

#include <fsdp/parallelize.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

// Bytes by kind: all-gather, reduce-scatter, all-reduce (per sequence and per micro-batch alike).
std::vector<int64_t> tp_bytes_by_kind(const std::vector<fsdp::PlanTpCollective>& collectives) {
  std::vector<int64_t> out(3, 0);
  for (const auto& c : collectives) out[c.kind] += c.bytes;
  return out;
}

gpt::GPTConfig moves_test_llama() {
  gpt::GPTConfig config = gpt::GPTConfig::sized(2, 128, 4, 64, "llama");
  config.kv_heads = 2;
  config.vocab_size = 256;
  return config;
}

TEST(PlannerTpMoves, ABlocksCollectivesAreItsStylesMoves) {
  const gpt::GPTConfig config = moves_test_llama();
  const int64_t T = config.max_seq, C = config.dim, e = 2, tp = 2;
  const auto block = gpt::styled_tp_collectives(gpt::gpt_layers(config).block, "h.0.", gpt::block_parallel_plan(config),
                                                T, e, tp);
  // attention's and the MLP's inputs gathered once each (q, k and v share one), their row-wise
  // outputs scattered; backward the converse; the two norms' gradients summed.
  const int64_t act = (tp - 1) * T * C * e / tp, norm = 2 * (tp - 1) * C * e / tp;
  EXPECT_EQ(tp_bytes_by_kind(block), (std::vector<int64_t>{4 * act, 4 * act, 2 * norm}));
  int64_t summed = 0;
  for (const auto& c : block) summed += c.parameter == "h.0.ln_1.weight" || c.parameter == "h.0.ln_2.weight";
  EXPECT_EQ(summed, 2);
}

TEST(PlannerTpMoves, AStyleChangedInThePlanChangesThePlannedBytes) {
  const gpt::GPTConfig config = moves_test_llama();
  const int64_t T = config.max_seq, C = config.dim, e = 4, tp = 2;
  const auto table = gpt::gpt_layers(config).block;
  fsdp::tp::ParallelizePlan plan = gpt::block_parallel_plan(config);
  const auto before = tp_bytes_by_kind(gpt::styled_tp_collectives(table, "", plan, T, e, tp));
  // Without the MLP's PrepareModuleInput, gate_proj and up_proj each take a replicated input:
  // the MLP's gather and its backward's reduce-scatter go, and each column-wise layer's input
  // gradient is all-reduced.
  plan.erase(std::remove_if(plan.begin(), plan.end(), [](const auto& entry) { return entry.first == "mlp"; }),
             plan.end());
  const auto after = tp_bytes_by_kind(gpt::styled_tp_collectives(table, "", plan, T, e, tp));
  const int64_t act = (tp - 1) * T * C * e / tp;
  EXPECT_EQ(after[0], before[0] - act);
  EXPECT_EQ(after[1], before[1] - act);
  EXPECT_EQ(after[2], before[2] + 2 * (2 * act));
}

}  // namespace
