#pragma once
// gpt_train --plan and --auto: the plan of the run its flags describe, or the fastest configuration
// under --max-memory-gb, and at the end of an --auto run the plan against what the run measured.

#include "plan_flags.h"
#include "trainer.h"

#include <fsdp/distributed.h>
#include <fsdp/plan.h>

#include <string>
#include <vector>

namespace gpt {

/// The setup of the run `o` describes under `flags`: world, device (probed unless the flags give
/// it), links, the GPT's description.
fsdp::PlanSetup setup_of_flags(const TrainOptions& o, const PlanFlags& flags);

/// Prints the plan of `setup` (or, with --max-memory-gb, the search around it: strategies,
/// activation checkpointing, --batches, offload on a GPU); --json for programs.
void print_plan(const fsdp::PlanSetup& setup, const PlanFlags& flags);

/// gpt_train --auto: the fastest configuration of strategy, activation checkpointing and batch per
/// rank (a divisor of --batch; gradient accumulation keeps the global batch) whose planned peak
/// fits --max-memory-gb. Every rank plans with rank 0's device numbers, so all choose the same.
/// A plan is kept only if its peak is under the cap by the planner's margin (fsdp::kPlanPeakMargin).
/// Throws when nothing fits, naming the smallest peak found. Rank 0 prints the search and the
/// choice, naming `replaced_flags` (e.g. "--strategy grad_op": given, and overridden).
fsdp::Plan choose_configuration(TrainOptions& o, const PlanFlags& flags, fsdp::Distributed& dist,
                                const std::vector<std::string>& replaced_flags);

/// Rank 0 prints the plan against the run: the largest peak over the ranks and the median step
/// time (steps after the first) beside the predicted ones (a collective). Throws on every rank
/// when a rank's measured peak exceeded --max-memory-gb: the run broke --auto's promise.
void check_plan_against_run(const fsdp::Plan& plan, const TrainOptions& o, const TrainResult& result,
                            const PlanFlags& flags, fsdp::Distributed& dist);

}  // namespace gpt
