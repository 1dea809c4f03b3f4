#include "pipeline_plan.h"

#include "pipeline_model.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <iostream>

namespace gpt {

namespace {

// The (pp size, micro-batches) pairs a search tries: every P dividing the ranks / --tp with a
// block per stage, at the micro-batches that keep the run's global batch (M·dp·batch: M·P
// constant, M = --microbatches · P / --pp where whole).
fsdp::PipelineSearchSpace search_space(const TrainOptions& o, int world) {
  fsdp::PipelineSearchSpace space;
  const int ranks = world / o.tp;
  for (int P = 1; P <= ranks; ++P) {
    if (ranks % P != 0 || P > o.model.layers) continue;
    const int64_t scaled = o.microbatches * static_cast<int64_t>(P);
    if (scaled % o.pp != 0) continue;
    space.pp_and_microbatches.emplace_back(P, static_cast<int>(scaled / o.pp));
  }
  if (o.pp_schedule == "interleaved-1f1b") space.interleaved_stages_per_rank = o.stages_per_rank;
  return space;
}

std::string schedule_flag(fsdp::pp::Schedule schedule) {
  switch (schedule) {
    case fsdp::pp::Schedule::GPipe: return "gpipe";
    case fsdp::pp::Schedule::OneFOneB: return "1f1b";
    case fsdp::pp::Schedule::Interleaved1F1B: return "interleaved-1f1b";
    case fsdp::pp::Schedule::ZBV: return "zbv";
  }
  return "1f1b";
}

}  // namespace

fsdp::PlanPipeline pipeline_of(const TrainOptions& o, const PlanFlags& flags) {
  fsdp::PlanPipeline pipeline;
  pipeline.schedule = pipeline_schedule(o.pp_schedule);
  pipeline.pp_size = o.pp;
  pipeline.stages_per_rank = o.stages_per_rank;
  pipeline.microbatches = o.microbatches;
  pipeline.whole_model_on_every_rank = !flags.pp_stages_only;
  pipeline.shard_alone = o.save_every > 0 || o.resume;  // pipeline_run.cpp shards every stage to checkpoint it
  pipeline.head_tied_to_embedding = o.model.head_is_wte();
  return pipeline;
}

void print_pipeline_plan(const TrainOptions& o, const fsdp::PlanSetup& setup, const PlanFlags& flags) {
  const fsdp::PlanPipeline pipeline = pipeline_of(o, flags);
  if (flags.max_memory_gb <= 0) {
    const fsdp::PipelinePlan plan = fsdp::plan_pipeline(setup, pipeline);
    std::cout << (flags.json ? fsdp::pipeline_plan_json(plan).dump(2) + "\n" : fsdp::pipeline_plan_text(plan));
    return;
  }
  const double cap = flags.max_memory_gb * kGiB;
  const auto result = fsdp::search_pipeline_plans(setup, pipeline, search_space(o, setup.world.world_size), cap);
  if (!flags.json) {
    std::cout << fsdp::pipeline_search_text(result, cap);
    return;
  }
  nlohmann::json fitting = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (const fsdp::PipelinePlan& p : result.fitting) fitting.push_back(fsdp::pipeline_plan_json(p));
  for (const auto& [p, why] : result.rejected) rejected.push_back({{"plan", fsdp::pipeline_plan_json(p)}, {"why", why}});
  const nlohmann::json out = {{"max_memory_bytes", cap}, {"fitting", fitting}, {"rejected", rejected},
                              {"not_planned", result.not_planned}};
  std::cout << out.dump(2) << "\n";
}

fsdp::PipelinePlan choose_pipeline(TrainOptions& o, const PlanFlags& flags, fsdp::Distributed& dist) {
  TORCH_CHECK(flags.max_memory_gb > 0, "--auto needs --max-memory-gb X: the memory each rank may use");
  fsdp::PlanWorld world = plan_world(flags);
  world.world_size = dist.world_size();
  // Every rank plans with rank 0's device numbers, so all choose the same.
  const fsdp::PlanDevice device = shared_device(plan_device(flags, o, world), dist);
  const fsdp::PlanSetup setup = plan_setup(o, world.world_size, world.ranks_per_host, device, plan_links(flags, device));
  fsdp::PipelineSearchSpace space = search_space(o, world.world_size);
  space.peak_margin = fsdp::kPlanPeakMargin;
  const double cap = flags.max_memory_gb * kGiB;
  const auto result = fsdp::search_pipeline_plans(setup, pipeline_of(o, flags), space, cap);
  if (dist.rank() == 0) std::cout << fsdp::pipeline_search_text(result, cap) << std::flush;
  if (!result.best()) {
    int64_t smallest = -1;
    for (const auto& [p, why] : result.rejected) {
      if (smallest < 0 || p.peak_bytes < smallest) smallest = p.peak_bytes;
    }
    TORCH_CHECK(false, "--auto --pp: no pp size, schedule and micro-batch count fits --max-memory-gb ",
                flags.max_memory_gb, " per rank with the planner's ", 100 * fsdp::kPlanPeakMargin,
                "% margin (the smallest planned peak is ", smallest / kGiB, " GiB); raise the cap, use more "
                "ranks, or a smaller model or --batch");
  }
  const fsdp::PipelinePlan best = *result.best();
  o.pp = best.pipeline.pp_size;
  o.pp_schedule = schedule_flag(best.pipeline.schedule);
  o.stages_per_rank = best.pipeline.stages_per_rank;
  o.microbatches = best.pipeline.microbatches;
  if (dist.rank() == 0) std::cout << "--auto: training with " << best.label() << "\n" << std::flush;
  return best;
}

void check_pipeline_plan_against_run(const fsdp::PipelinePlan& plan, const TrainOptions& o, const TrainResult& result,
                                     const PlanFlags& flags, fsdp::Distributed& dist) {
  auto peaks = torch::zeros({dist.world_size()}, torch::kFloat64);
  peaks[dist.rank()] = static_cast<double>(result.summary.peak_bytes());
  fsdp::all_reduce_sum(*dist.world, peaks);
  const int per_pp_rank = dist.world_size() / plan.pipeline.pp_size;  // the mesh pp x dp x tp: pp outermost
  if (dist.rank() == 0) {
    for (const fsdp::PipelineRankPlan& r : plan.ranks) {
      const double measured = peaks.slice(0, r.pp_rank * per_pp_rank, (r.pp_rank + 1) * per_pp_rank).max().item<double>();
      std::printf("plan vs run: pp rank %d peak predicted %.2f MiB, measured %.2f MiB (%.3fx)\n", r.pp_rank,
                  r.peak.total() / 1048576.0, measured / 1048576.0, measured / static_cast<double>(r.peak.total()));
    }
    std::fflush(stdout);
  }
  const double cap = flags.max_memory_gb * kGiB;
  const double measured_peak = peaks.max().item<double>();
  TORCH_CHECK(measured_peak <= cap, "--auto: rank ", peaks.argmax().item<int64_t>(), "'s measured peak ",
              measured_peak / 1048576.0, " MiB exceeded --max-memory-gb ", flags.max_memory_gb, " (planned ",
              plan.peak_bytes / 1048576.0, " MiB for ", plan.label(), "): the planner was wrong for this run; "
              "lower --max-memory-gb or choose the pipeline by hand, and report the plan");
}

}  // namespace gpt
