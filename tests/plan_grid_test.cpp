// The planner against the run it plans: for every sharding strategy, fp32 and bf16, with and
// without activation checkpointing and at two batch sizes (and with the rate limiter at one unit,
// and without prefetch), gpt_train's training loop runs a few
// steps here and each rank's measured peak tensor memory (fsdp::memory_stats, the counting
// allocator) must be within 10% of the plan's, and the bytes each kind of collective sent (the
// counters) exactly the plan's. Rank 0 prints the table: predicted, measured, their ratio.
#include "dist_env.h"
#include "error_of.h"
#include "parity_check.h"

#include "gpt_plan.h"
#include "options.h"
#include "trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

namespace fsdp_test {
namespace {

constexpr double kPeakTolerance = 0.10;
// --auto keeps a plan only if peak <= (1 - margin) x cap: a run may exceed its plan by this much.
const double kMostOverPlan = 1 / (1 - fsdp::kPlanPeakMargin);

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
  int64_t micro_batches = 1;
  bool no_sync = false;
  bool llama = false;  // a Llama (grouped-query attention, untied head) of the same size
  std::vector<std::string> freeze;  // gpt_train's --freeze
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
  // Gradient accumulation ([Note: micro-batches in the plan]): the gradient shards of earlier
  // micro-batches alive through the later ones, or (no_sync) every unsharded gradient.
  for (int64_t micro : {2, 4}) {
    for (bool no_sync : {false, true}) {
      for (bool checkpointing : {false, true}) {
        GridCase c;
        c.fsdp.activation_checkpointing(checkpointing);
        c.batch = 1;
        c.micro_batches = micro;
        c.no_sync = no_sync;
        c.label = std::string("full fp32") + (checkpointing ? " AC" : "   ") + " b1 x" + std::to_string(micro) +
                  (no_sync ? " no_sync" : "");
        cases.push_back(c);
      }
    }
  }
  // Frozen parameters (--freeze): a whole block and every attention, so that units hold frozen
  // and trainable flat groups side by side, and one holds only frozen ones.
  for (const auto& [strategy, f] : strategies) {
    for (bool bf16 : {false, true}) {
      GridCase c;
      c.fsdp.strategy(strategy).shard_group_size(f);
      if (bf16) c.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
      c.batch = 4;
      c.freeze = {"h.1.", ".attn."};
      c.label = std::string(fsdp::to_string(strategy)) + (bf16 ? " bf16" : " fp32") + " frozen b4";
      cases.push_back(c);
    }
  }
  // A Llama: every strategy, fp32 and bf16, with and without activation checkpointing.
  for (const auto& [strategy, f] : strategies) {
    for (bool bf16 : {false, true}) {
      for (bool checkpointing : {false, true}) {
        GridCase c;
        c.fsdp.strategy(strategy).shard_group_size(f).activation_checkpointing(checkpointing);
        if (bf16) c.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
        c.batch = 4;
        c.llama = true;
        c.label = std::string("Llama ") + fsdp::to_string(strategy) + (bf16 ? " bf16" : " fp32") +
                  (checkpointing ? " AC" : "");
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// The grid's model: a GPT, or a Llama of the same size (2 key/value heads, an untied head).
gpt::TrainOptions grid_run(const GridCase& c) {
  auto o = tiny_gpt_run(/*layers=*/4, /*dim=*/128, /*heads=*/4, /*seq=*/64, c.batch, /*steps=*/3);
  if (c.llama) {
    o.model.family = "llama";
    o.model.kv_heads = 2;
  }
  return o;
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
    std::printf("W = %d: GPT (and Llama, 2 kv heads) 4x128, 4 heads, seq 64; peak tensor bytes per rank, steps 2-3\n", w);
    std::printf("%-22s %4s %12s %12s %7s  %s\n", "configuration", "rank", "predicted", "measured", "ratio", "peak during");
  }
  for (const GridCase& c : grid(w)) {
    auto o = grid_run(c);
    o.max_data_bytes = 64 << 10;
    o.fsdp = c.fsdp;
    o.grad_accum = c.micro_batches;
    o.no_sync = c.no_sync;
    o.freeze = c.freeze;
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
    EXPECT_LE(ratio, kMostOverPlan) << c.label << ": above the margin --auto keeps (fsdp::kPlanPeakMargin)";
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

// gpt_train --tp 2 against its plan ([Note: tensor parallelism in the plan]): at W = 2 (dp 1 x
// tp 2) and W = 4 (dp 2 x tp 2), the grid's GPT and Llama (2 kv heads, untied head), fp32 and
// bf16, with and without activation checkpointing, full and grad_op: every rank's measured peak
// within the grid's 10% of its plan and under --auto's margin, and every collective's bytes, FSDP's
// over the data-parallel ranks and TP's (comm_stats' tp_*), exactly the plan's; with --optimizer
// muon (one case of each model) also each rank's all-to-all bytes of Muon's exchange.
TEST(Planner, TpPeakAndBytesMatchTheRunOnEveryRank) {
  const int w = dist().world_size(), tp = 2;
  if (w != 2 && w != 4) GTEST_SKIP() << "(dp, tp) = (1, 2) at W = 2 and (2, 2) at W = 4";
  using S = fsdp::ShardingStrategy;
  double worst = 1;
  if (dist().rank() == 0) {
    std::printf("W = %d, --tp 2: GPT and Llama 4x128, 4 heads, seq 64, batch 4; peak tensor bytes per rank, steps 2-3\n", w);
    std::printf("%-26s %4s %12s %12s %7s  %s\n", "configuration", "rank", "predicted", "measured", "ratio", "peak during");
  }
  for (bool llama : {false, true}) {
    for (bool bf16 : {false, true}) {
      for (bool checkpointing : {false, true}) {
        for (S strategy : {S::FullShard, S::ShardGradOp}) {
          // Muon on one case of each model (its exchange over both dimensions).
          const bool muon = !bf16 && !checkpointing && strategy == S::FullShard;
          GridCase c;
          c.llama = llama;
          c.batch = 4;
          c.fsdp.strategy(strategy).activation_checkpointing(checkpointing);
          if (bf16) c.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
          c.label = std::string(llama ? "Llama " : "GPT ") + fsdp::to_string(strategy) + (bf16 ? " bf16" : " fp32") +
                    (checkpointing ? " AC" : "") + (muon ? " Muon" : "");
          auto o = grid_run(c);
          o.max_data_bytes = 64 << 10;
          o.fsdp = c.fsdp;
          o.tp = tp;
          o.muon = muon;
          const fsdp::Plan plan = fsdp::plan(gpt::plan_setup(o, w, w, fsdp::PlanDevice{}, fsdp::PlanLinks{}));
          const int64_t baseline = fsdp::memory_stats().current_bytes;
          const gpt::TrainResult run = gpt::train(o, &dist());
          int64_t measured = 0;
          for (size_t s = 1; s < run.steps.size(); ++s) {
            measured = std::max(measured, run.steps[s].memory.peak_bytes - baseline);
            const fsdp::CommStats& sent = run.steps[s].comm;
            EXPECT_EQ(sent.all_gather_bytes, plan.traffic.all_gather) << c.label;
            EXPECT_EQ(sent.reduce_scatter_bytes, plan.traffic.reduce_scatter) << c.label;
            EXPECT_EQ(sent.all_reduce_bytes, plan.traffic.all_reduce) << c.label;
            EXPECT_EQ(sent.tp_all_gather_bytes, plan.traffic.tp_all_gather) << c.label;
            EXPECT_EQ(sent.tp_reduce_scatter_bytes, plan.traffic.tp_reduce_scatter) << c.label;
            EXPECT_EQ(sent.tp_all_reduce_bytes, plan.traffic.tp_all_reduce) << c.label;
            if (muon) {
              EXPECT_EQ(sent.all_to_all_bytes, plan.muon.all_to_all_by_rank.at(dist().rank())) << c.label;
            }
          }
          // The plan has one entry per data-parallel rank: world rank r is dp rank r / tp.
          const fsdp::RankMemory& mine = plan.ranks.at(dist().rank() / tp);
          const double predicted = static_cast<double>(mine.peak.total());
          const double ratio = measured / predicted;
          EXPECT_NEAR(ratio, 1.0, kPeakTolerance) << c.label << ": predicted " << predicted << ", measured "
                                                  << measured << " (peak during " << mine.peak_at << ")";
          EXPECT_LE(ratio, kMostOverPlan) << c.label << ": above the margin --auto keeps (fsdp::kPlanPeakMargin)";
          const auto measured_all = from_every_rank(static_cast<double>(measured));
          if (dist().rank() == 0) {
            for (int r = 0; r < w; ++r) {
              const double p = static_cast<double>(plan.ranks[r / tp].peak.total());
              const double q = measured_all[r] / p;
              std::printf("%-26s %4d %12.0f %12.0f %7.3f  %s\n", c.label.c_str(), r, p, measured_all[r], q,
                          plan.ranks[r / tp].peak_at.c_str());
              if (std::abs(q - 1) > std::abs(worst - 1)) worst = q;
            }
          }
        }
      }
    }
  }
  if (dist().rank() == 0) std::printf("--tp 2 worst: measured / predicted = %.3f\n", worst);
}

// The peak of a run's steps after the first (which creates the optimizer state), above `baseline`.
int64_t measured_peak(const gpt::TrainResult& run, int64_t baseline) {
  int64_t peak = 0;
  for (size_t s = 1; s < run.steps.size(); ++s) peak = std::max(peak, run.steps[s].memory.peak_bytes - baseline);
  return peak;
}

// --auto at caps just above the plans it may choose: for each candidate's peak, the smallest cap
// that accepts it (peak / (1 - margin), plus a byte). The configuration --auto then chooses
// (with gradient accumulation where it takes a smaller batch) trains under that cap on every rank.
TEST(Planner, AutoTrainsUnderItsCapWhenTheCapIsJustAboveTheChosenPlan) {
  const int w = dist().world_size();
  auto base = tiny_gpt_run(/*layers=*/4, /*dim=*/128, /*heads=*/4, /*seq=*/64, /*batch=*/4, /*steps=*/3);
  base.max_data_bytes = 64 << 10;
  gpt::PlanFlags flags;
  flags.ranks = flags.ranks_per_host = w;
  flags.tflops_fp32 = flags.tflops_bf16 = 0.05;  // given rates: no probe (they only rank the plans)
  flags.memory_gbps = 10;
  const fsdp::PlanDevice device = gpt::plan_device(flags, base, fsdp::PlanWorld{w, w});
  fsdp::SearchSpace space;
  space.batches = {4, 2, 1};
  space.keep_global_batch = true;
  const fsdp::SearchResult everything =
      fsdp::search_plans(gpt::plan_setup(base, w, w, device, gpt::plan_links(flags, device)), space, 1e15);
  std::vector<int64_t> peaks;
  for (const fsdp::Plan& p : everything.fitting) peaks.push_back(p.peak_bytes);
  std::sort(peaks.begin(), peaks.end());
  peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
  ASSERT_GE(peaks.size(), 4u);
  if (dist().rank() == 0) std::printf("W = %d: --auto at caps just above a plan\n", w);
  std::set<std::string> chosen;
  for (size_t i = 0; i < peaks.size(); i += 2) {  // every other candidate: the smallest to the largest
    const double cap = static_cast<double>(peaks[i]) / (1 - fsdp::kPlanPeakMargin) + 1;
    flags.max_memory_gb = cap / gpt::kGiB;
    gpt::TrainOptions o = base;
    const fsdp::Plan plan = gpt::choose_configuration(o, flags, dist(), {});
    EXPECT_LE(static_cast<double>(plan.peak_bytes), (1 - fsdp::kPlanPeakMargin) * cap + 1) << plan.label();
    EXPECT_EQ(o.batch * o.grad_accum, base.batch) << plan.label() << ": the global batch changed";
    const int64_t baseline = fsdp::memory_stats().current_bytes;
    const gpt::TrainResult run = gpt::train(o, &dist());
    const int64_t measured = measured_peak(run, baseline);
    EXPECT_LE(static_cast<double>(measured), cap) << plan.label() << " at a cap of " << cap << " bytes";
    chosen.insert(plan.label());
    const auto all = from_every_rank(static_cast<double>(measured));
    if (dist().rank() == 0) {
      std::printf("  cap %10.0f: %-40s planned %9lld, measured (max over ranks) %9.0f, %.3f of the cap\n", cap,
                  plan.label().c_str(), static_cast<long long>(plan.peak_bytes),
                  *std::max_element(all.begin(), all.end()), *std::max_element(all.begin(), all.end()) / cap);
    }
  }
  EXPECT_GE(chosen.size(), 2u) << "the caps should lead --auto to different configurations";
}

// After an --auto run, a measured peak above --max-memory-gb on any one rank fails every rank,
// naming the rank, the cap and the plan (the run broke the promise --auto made).
TEST(Planner, AnAutoRunAboveItsCapFailsOnEveryRank) {
  const int w = dist().world_size();
  gpt::TrainOptions o = tiny_gpt_run(/*layers=*/2, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/2);
  gpt::PlanFlags flags;
  flags.max_memory_gb = 1.0 / 1024;  // 1 MiB
  const fsdp::Plan plan = fsdp::plan(gpt::plan_setup(o, w, w, fsdp::PlanDevice{}, fsdp::PlanLinks{}));
  const int over = w - 1;  // the last rank alone goes over
  // Two steps as the trainer records them (its summary), the second one's peak given.
  auto run_peaking_at = [](int64_t second_peak) {
    gpt::TrainResult run;
    gpt::StepRecord step;
    step.memory.peak_bytes = (1 << 20) - 1;
    run.summary.add(step);
    step.memory.peak_bytes = second_peak;
    run.summary.add(step);
    return run;
  };
  const gpt::TrainResult run = run_peaking_at(dist().rank() == over ? (1 << 20) + 1 : (1 << 20) - 1);
  const std::string error = error_of([&] { gpt::check_plan_against_run(plan, o, run, flags, dist()); });
  EXPECT_NE(error.find("rank " + std::to_string(over) + "'s measured peak"), std::string::npos) << error;
  EXPECT_NE(error.find("exceeded --max-memory-gb"), std::string::npos) << error;
  const gpt::TrainResult at_the_cap = run_peaking_at(1 << 20);  // at the cap is under it
  EXPECT_EQ(error_of([&] { gpt::check_plan_against_run(plan, o, at_the_cap, flags, dist()); }), "");
}

}  // namespace
}  // namespace fsdp_test
