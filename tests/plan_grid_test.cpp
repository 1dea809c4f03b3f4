// The planner against the run it plans: for every sharding strategy, fp32 and bf16, with and
// without activation checkpointing and at two batch sizes (and with the rate limiter at one unit,
// and without prefetch), gpt_train's training loop runs a few
// steps here and each rank's measured peak tensor memory (fsdp::memory_stats, the counting
// allocator) must be within 10% of the plan's, and the bytes each kind of collective sent (the
// counters) exactly the plan's. Rank 0 prints the table: predicted, measured, their ratio.
#include "dist_env.h"
#include "parity_check.h"

#include "gpt_plan.h"
#include "trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

namespace fsdp_test {
namespace {

constexpr double kPeakTolerance = 0.10;

// The largest shard group with at least two replicas (W >= 2F), 0 if none.
int hybrid_group(int world) {
  for (int f = world / 2; f >= 1; --f) {
    if (world % f == 0) return f;
  }
  return 0;
}

struct GridCase {
  fsdp::FullyShardOptions fsdp;
  int64_t batch;
  std::string label;
};

std::vector<GridCase> grid(int world) {
  using S = fsdp::ShardingStrategy;
  std::vector<std::pair<S, int>> strategies = {{S::FullShard, 0}, {S::ShardGradOp, 0}, {S::NoShard, 0}};
  if (int f = hybrid_group(world)) strategies.emplace_back(S::HybridShard, f);
  std::vector<GridCase> cases;
  for (const auto& [strategy, f] : strategies) {
    for (bool bf16 : {false, true}) {
      for (bool checkpointing : {false, true}) {
        for (int64_t batch : {1, 4}) {
          GridCase c;
          c.fsdp.strategy(strategy).shard_group_size(f).activation_checkpointing(checkpointing);
          if (bf16) c.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
          c.batch = batch;
          c.label = std::string(fsdp::to_string(strategy)) + (bf16 ? " bf16" : " fp32") +
                    (checkpointing ? " AC" : "   ") + " b" + std::to_string(batch);
          cases.push_back(c);
        }
      }
    }
  }
  // The rate limiter at one unit, and no prefetch at all: what the limiter refuses and what
  // prefetch adds show in the peak.
  GridCase limited;
  limited.fsdp.limit_all_gathers(1);
  limited.batch = 4;
  limited.label = "full fp32 limit 1 b4";
  cases.push_back(limited);
  GridCase no_prefetch;
  no_prefetch.fsdp.forward_prefetch(false).backward_prefetch(fsdp::BackwardPrefetch::None);
  no_prefetch.batch = 4;
  no_prefetch.label = "full fp32 no prefetch b4";
  cases.push_back(no_prefetch);
  return cases;
}

// Every rank's value, on every rank.
std::vector<double> from_every_rank(double value) {
  auto t = torch::zeros({dist().world_size()}, torch::kFloat64);
  t[dist().rank()] = value;
  fsdp::all_reduce_sum(*dist().world, t);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

TEST(Planner, PredictedPeakAndBytesMatchTheRunOnEveryRank) {
  const int w = dist().world_size();
  double worst = 1;
  std::string worst_case;
  if (dist().rank() == 0) {
    std::printf("W = %d: GPT 4x128, 4 heads, seq 64; peak tensor bytes per rank, steps 2-3\n", w);
    std::printf("%-22s %4s %12s %12s %7s  %s\n", "configuration", "rank", "predicted", "measured", "ratio", "peak during");
  }
  for (const GridCase& c : grid(w)) {
    auto o = tiny_gpt_run(/*layers=*/4, /*dim=*/128, /*heads=*/4, /*seq=*/64, c.batch, /*steps=*/3);
    o.max_data_bytes = 64 << 10;
    o.fsdp = c.fsdp;
    const fsdp::Plan plan = fsdp::plan(gpt::plan_setup(o, w, w, fsdp::PlanDevice{}, fsdp::PlanLinks{}));
    const int64_t baseline = fsdp::memory_stats().current_bytes;
    const gpt::TrainResult run = gpt::train(o, &dist());
    int64_t measured = 0;
    for (size_t s = 1; s < run.steps.size(); ++s) {  // the first step creates the optimizer state
      measured = std::max(measured, run.steps[s].memory.peak_bytes - baseline);
      const fsdp::CommStats& sent = run.steps[s].comm;
      EXPECT_EQ(sent.all_gather_bytes, plan.traffic.all_gather) << c.label;
      EXPECT_EQ(sent.reduce_scatter_bytes, plan.traffic.reduce_scatter) << c.label;
      EXPECT_EQ(sent.all_reduce_bytes, plan.traffic.all_reduce) << c.label;
    }
    const fsdp::RankMemory& mine = plan.ranks.at(dist().rank());
    const double predicted = static_cast<double>(mine.peak.total());
    const double ratio = measured / predicted;
    EXPECT_NEAR(ratio, 1.0, kPeakTolerance) << c.label << ": predicted " << predicted << ", measured "
                                            << measured << " (peak during " << mine.peak_at << ")";
    const auto measured_all = from_every_rank(static_cast<double>(measured));
    if (dist().rank() == 0) {
      for (int r = 0; r < w; ++r) {
        const double p = static_cast<double>(plan.ranks[r].peak.total());
        const double q = measured_all[r] / p;
        std::printf("%-22s %4d %12.0f %12.0f %7.3f  %s\n", c.label.c_str(), r, p, measured_all[r], q,
                    plan.ranks[r].peak_at.c_str());
        if (std::abs(q - 1) > std::abs(worst - 1)) {
          worst = q;
          worst_case = c.label + " rank " + std::to_string(r);
        }
      }
    }
  }
  if (dist().rank() == 0) std::printf("worst: %s, measured / predicted = %.3f\n", worst_case.c_str(), worst);
}

}  // namespace
}  // namespace fsdp_test
