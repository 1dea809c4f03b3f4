// The planner for pipeline parallelism ([Note: a pipeline in the plan] in
// src/plan/plan_pipeline.cpp): the micro-batches in flight, counted on the action lists the
// runner executes, against the schedules' formulas (docs/pipeline-parallel.md); the plan's
// activations are that count times a micro-batch's; a stage sharded over dp holds its gathered
// parameters and one gradient sum across the micro-batches; the bytes and the bubble; refusals by
// name; and the shape of torchtitan's Llama 3.1 405B rows (docs/planner.md).
#include "gpt_plan.h"
#include "options.h"

#include <fsdp/plan_pipeline.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using fsdp::pp::Schedule;

gpt::TrainOptions small_llama() {
  gpt::TrainOptions o;
  o.model = gpt::GPTConfig::sized(8, 64, 4, 64, "llama");
  o.model.kv_heads = 2;
  o.model.ffn_dim = 128;
  o.model.vocab_size = 256;
  o.model.tied_head = false;
  o.batch = 2;
  return o;
}

fsdp::PlanSetup setup_of(const gpt::TrainOptions& o, int ranks, int tp = 1, const std::string& gpu = "h100-80gb") {
  gpt::PlanFlags flags;
  flags.ranks = ranks;
  flags.ranks_per_host = std::min(ranks, 8);
  flags.gpu = gpu;
  gpt::TrainOptions run = o;
  run.tp = tp;
  return gpt::setup_of_flags(run, flags);
}

fsdp::PlanPipeline pipeline(Schedule schedule, int pp, int microbatches, int stages_per_rank = 1) {
  fsdp::PlanPipeline p;
  p.schedule = schedule;
  p.pp_size = pp;
  p.microbatches = microbatches;
  p.stages_per_rank = stages_per_rank;
  return p;
}

// docs/pipeline-parallel.md's table: GPipe holds all M micro-batches on every rank, 1F1B P - r on
// rank r (M >= P), walked on the lists pp::rank_actions gives the runner.
TEST(PlannerPipeline, InFlightFromTheActionListsIsTheScheduleFormula) {
  for (int P = 2; P <= 4; ++P) {
    for (int M : {P, 2 * P, 4 * P}) {
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(fsdp::max_in_flight(fsdp::pp::rank_actions(Schedule::GPipe, P, P, M, r), r), M)
            << "GPipe P=" << P << " M=" << M << " rank " << r;
        EXPECT_EQ(fsdp::max_in_flight(fsdp::pp::rank_actions(Schedule::OneFOneB, P, P, M, r), r), P - r)
            << "1F1B P=" << P << " M=" << M << " rank " << r;
      }
    }
  }
  // GPipe with fewer micro-batches than stages still holds them all.
  EXPECT_EQ(fsdp::max_in_flight(fsdp::pp::rank_actions(Schedule::GPipe, 4, 4, 2, 0), 0), 2);
  // ZBV holds at most 2P at once on a rank (its two stages together, counted until W): the
  // plan's count at each rank's peak.
  for (int P = 2; P <= 4; ++P) {
    const fsdp::PipelinePlan plan = fsdp::plan_pipeline(setup_of(small_llama(), P), pipeline(Schedule::ZBV, P, 2 * P));
    for (const fsdp::PipelineRankPlan& r : plan.ranks) EXPECT_LE(r.in_flight, 2 * P) << "ZBV P=" << P;
  }
}

// The plan's activations are the walked count times one micro-batch's stage activations; at
// dp 1 a whole stage keeps its parameters, gradients and AdamW's two moments.
TEST(PlannerPipeline, ActivationsAreTheMicroBatchesInFlightTimesOnesStageActivations) {
  const gpt::TrainOptions o = small_llama();
  const fsdp::PlanSetup setup = setup_of(o, 2);
  for (auto [schedule, M, held0, held1] : {std::tuple{Schedule::OneFOneB, 4, 2, 1}, {Schedule::OneFOneB, 8, 2, 1},
                                           {Schedule::GPipe, 4, 4, 4}, {Schedule::GPipe, 8, 8, 8}}) {
    const fsdp::PipelinePlan plan = fsdp::plan_pipeline(setup, pipeline(schedule, 2, M));
    ASSERT_EQ(plan.ranks.size(), 2u);
    EXPECT_EQ(plan.ranks[0].in_flight, held0);
    EXPECT_EQ(plan.ranks[1].in_flight, held1);
    for (const fsdp::PipelineRankPlan& r : plan.ranks) {
      EXPECT_EQ(r.peak.activations, r.in_flight * r.microbatch_activations);
      EXPECT_EQ(r.peak.sharded_params, 4 * r.parameters);
      // Gradients at the peak only once the stage's first backward ran (1F1B's steady state;
      // GPipe peaks before its first backward, with none).
      EXPECT_EQ(r.peak.sharded_grads, schedule == Schedule::GPipe ? 0 : 4 * r.parameters);
      EXPECT_EQ(r.peak.optimizer_state, 8 * r.parameters);
      EXPECT_EQ(r.peak.unsharded_params, 0);
    }
    EXPECT_EQ(plan.ranks[0].units, (std::vector<std::string>{"h.0", "h.1", "h.2", "h.3"}));
    EXPECT_NEAR(plan.bubble, 1.0 / (M + 1), 1e-12);
  }
}

// At pp 2 x dp 2 (1F1B, M = 4) each stage is sharded over its dp ranks and held unsharded for the step: its
// gathered parameters and one unsharded gradient sum (fp32 here), its shards and their moments;
// FSDP's bytes once per step; the pipeline's M·(a + 80) per boundary.
TEST(PlannerPipeline, AShardedStageHoldsItsGatheredParametersAcrossTheMicroBatches) {
  const gpt::TrainOptions o = small_llama();
  const fsdp::PlanSetup setup = setup_of(o, 4);
  const fsdp::PipelinePlan plan = fsdp::plan_pipeline(setup, pipeline(Schedule::OneFOneB, 2, 4));
  EXPECT_EQ(plan.dp_size, 2);
  for (const fsdp::PipelineRankPlan& r : plan.ranks) {
    const int64_t shard = (r.parameters + 1) / 2;
    EXPECT_EQ(r.peak.unsharded_params, 2 * shard * 4);
    EXPECT_EQ(r.peak.unsharded_grads, 2 * shard * 4);
    EXPECT_EQ(r.peak.sharded_params, shard * 4);
    EXPECT_EQ(r.peak.optimizer_state, shard * 8);
    EXPECT_EQ(r.all_gather, shard * 4);
    EXPECT_EQ(r.reduce_scatter, shard * 4);
    EXPECT_EQ(r.pp_send_bytes, 4 * (o.batch * o.model.max_seq * o.model.dim * 4 + 80));
  }
}

TEST(PlannerPipeline, WhatAStageDoesNotRunIsRefusedByName) {
  gpt::TrainOptions o = small_llama();
  const fsdp::PlanSetup setup = setup_of(o, 4);
  auto refused = [&](const fsdp::PlanSetup& s, const fsdp::PlanPipeline& p, const std::string& words) {
    try {
      fsdp::plan_pipeline(s, p);
      ADD_FAILURE() << "planned; expected a refusal naming " << words;
    } catch (const c10::Error& e) {
      EXPECT_NE(e.msg().find(words), std::string::npos) << e.msg();
    }
  };
  refused(setup, pipeline(Schedule::OneFOneB, 3, 4), "does not divide the world size 4");
  refused(setup, pipeline(Schedule::OneFOneB, 2, 1), "1F1B");
  refused(setup, pipeline(Schedule::Interleaved1F1B, 2, 4, 8), "need at least 16 units");
  fsdp::PlanSetup offload = setup;
  offload.policy.fsdp.cpu_offload(true);
  refused(offload, pipeline(Schedule::GPipe, 2, 2), "cpu_offload");
  // A tied head at dp 2 (4 ranks, pp 2): ZBV puts the first and the last stage on rank 0, where two
  // sharded stages cannot both hold the tensor; 1F1B puts them apart and plans.
  fsdp::PlanPipeline tied = pipeline(Schedule::ZBV, 2, 4);
  tied.head_tied_to_embedding = true;
  refused(setup, tied, "first and the last stage on one rank");
  tied.schedule = Schedule::OneFOneB;
  EXPECT_NO_THROW(fsdp::plan_pipeline(setup, tied));
}

// torchtitan's Llama 3.1 405B on 512 H100s as FSDP 8 x TP 8 x PP 8 (docs/planner.md): one
// sequence per micro-batch, M = P = 8, bf16 with fp32 reductions, each block checkpointed. It
// fits; interleaved 1F1B (V = 2) holds less than 1F1B and is faster (its bubble 7/23 against 7/15).
TEST(PlannerPipeline, Llama405BOn512H100sFitsAndInterleavedHoldsLessThan1F1B) {
  gpt::TrainOptions o;
  o.model = gpt::GPTConfig::sized(126, 16384, 128, 8192, "llama");
  o.model.kv_heads = 8;
  o.model.ffn_dim = 53248;
  o.model.vocab_size = 128256;
  o.model.tied_head = false;
  o.batch = 1;
  o.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
  o.fsdp.activation_checkpointing(true);
  const fsdp::PlanSetup setup = setup_of(o, 512, 8);
  auto plan = [&](Schedule schedule, int M, int V) {
    fsdp::PlanPipeline p = pipeline(schedule, 8, M, V);
    return fsdp::plan_pipeline(setup, p);
  };
  const fsdp::PipelinePlan one = plan(Schedule::OneFOneB, 8, 1);
  const fsdp::PipelinePlan interleaved = plan(Schedule::Interleaved1F1B, 8, 2);
  EXPECT_EQ(one.dp_size, 8);
  EXPECT_TRUE(one.fits);
  EXPECT_TRUE(interleaved.fits);
  EXPECT_LT(interleaved.peak_bytes, one.peak_bytes);
  EXPECT_GT(interleaved.time.tokens_per_s, one.time.tokens_per_s);
  // At M = 16 the walk finds interleaved holding more activations (23 half-stages in flight on rank
  // 0 against 8 stages), but a half-stage's bf16 gradient, written beside the kept fp32 sum in
  // backward, is half of a whole stage's: it still holds less.
  const fsdp::PipelinePlan one16 = plan(Schedule::OneFOneB, 16, 1);
  const fsdp::PipelinePlan interleaved16 = plan(Schedule::Interleaved1F1B, 16, 2);
  EXPECT_GT(interleaved16.ranks[0].peak.activations, one16.ranks[0].peak.activations);
  EXPECT_LT(interleaved16.peak_bytes, one16.peak_bytes);
}

}  // namespace
