#pragma once
// gpt_train --plan / --auto and fsdp_plan with --pp: the pipelined run planned
// (fsdp::plan_pipeline, docs/planner.md "Pipeline parallelism").
#include "gpt_plan.h"

#include <fsdp/plan_pipeline.h>

namespace gpt {

/// The pipeline of run `o` as the planner takes it: its schedule, pp size, stages per rank and
/// micro-batches; gpt_train builds the whole model on every rank (unless --pp-stages-only plans
/// a program that keeps its stages only); GPT-2's head is tied to wte.
fsdp::PlanPipeline pipeline_of(const TrainOptions& o, const PlanFlags& flags);
/// Prints the plan of the pipelined run (or, with --max-memory-gb, the search over pp sizes,
/// schedules and micro-batches keeping the global batch).
void print_pipeline_plan(const TrainOptions& o, const fsdp::PlanSetup& setup, const PlanFlags& flags);
/// gpt_train --auto --pp: the fastest pp size, schedule and micro-batch count (the global batch
/// kept) whose every rank's planned peak fits --max-memory-gb with the planner's margin; sets them
/// in `o`. Throws when none fits, naming the smallest peak.
fsdp::PipelinePlan choose_pipeline(TrainOptions& o, const PlanFlags& flags, fsdp::Distributed& dist);
/// Rank 0 prints each pp rank's planned peak beside the largest measured on its ranks; throws on
/// every rank when a rank's measured peak exceeded --max-memory-gb (a collective).
void check_pipeline_plan_against_run(const fsdp::PipelinePlan& plan, const TrainOptions& o, const TrainResult& result,
                                     const PlanFlags& flags, fsdp::Distributed& dist);

}  // namespace gpt
