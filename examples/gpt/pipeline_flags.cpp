// gpt_train --pp's flags: how the model is split and scheduled, and what does not compose with a
// pipeline yet, refused by name before any rendezvous or work.
#include "command_line.h"
#include "pipeline_model.h"

#include <fsdp/pipeline.h>

#include <string>
#include <utility>
#include <vector>

namespace gpt {

void add_pipeline_options(CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  app.add_option("--pp", o.pp,
                 "pipeline parallelism: split the model into stages over P ranks, the mesh pp x dp "
                 "(dp = world / P; each stage sharded over dp; docs/pipeline-parallel.md)")
      ->check(integer_in(1, 1 << 16));
  app.add_option("--pp-schedule", o.pp_schedule, "with --pp: gpipe | 1f1b | interleaved-1f1b | zbv")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved-1f1b", "zbv"}))
      ->capture_default_str();
  app.add_option("--stages-per-rank", o.stages_per_rank,
                 "with --pp: stages on each rank (interleaved-1f1b: V >= 1, default 2; zbv: 2)")
      ->check(integer_in(1, 1 << 10));
  app.add_option("--microbatches", o.microbatches,
                 "with --pp: micro-batches per step, each of --batch rows per dp rank (as "
                 "--grad-accum's)")
      ->check(integer_in(1, 1 << 20));
}

namespace {

// The flags that do not run with --pp yet, each with why (given: whether the run sets it).
std::vector<std::pair<bool, std::string>> not_with_pipeline(const CLI::App& app, const CommandLine& cl) {
  const TrainOptions& o = cl.train;
  return {
      {cl.reference, "--reference (it trains the unsharded model: give it --world-size WORLD/pp "
                     "--grad-accum M for the same batches)"},
      {cl.autoplan && !cl.planner.tp_sizes.empty(), "--auto --tp-sizes (a pipelined --auto searches pp sizes, "
                                                    "schedules and micro-batches at the given --tp)"},
      {o.test_pause_after_shard_files_ms > 0, "--test-pause-after-shard-files (a pipelined save takes no test hooks)"},
      {!o.eval_out.empty(), "--eval-out (the pipelined eval gives the loss, printed; the logits stay on the last "
                            "stage's rank and are not gathered: compare logits with an unpipelined run)"},
      {cl.cpu_offload, "--cpu-offload (FSDP inside a stage refuses it: the stage holds its gathered parameters "
                       "across micro-batches, which CPU offload is not built beside)"},
      {cl.keep_after_forward, "--no-reshard-after-forward (a stage is gathered once per step and kept for all "
                              "its micro-batches already)"},
      {o.step_in_backward, "--step-in-backward (the stages step after the schedule's last backward, once the "
                           "gradients of every micro-batch are summed)"},
      {o.no_sync, "--no-sync (a sharded stage reduces once per schedule already; --grad-accum adds whole "
                  "schedules)"},
      {o.fsdp.mixed_precision().param_dtype() == torch::kHalf || o.fsdp.mixed_precision().reduce_dtype() == torch::kHalf,
       "fp16 (--param-dtype/--reduce-dtype fp16 need loss scaling, which the pipelined step does not run yet; use "
       "bf16)"},
      {o.deferred_init, "--deferred-init (every rank builds the whole model, then keeps its stages: a stage "
                        "built on meta and materialised alone, by its parameters' names, is not built in "
                        "fsdp::pp::Stage yet)"},
  };
}

// --stages-per-rank against the schedule: ZBV places exactly two per rank, GPipe and 1F1B one.
std::string check_stages_per_rank(const CLI::App& app, TrainOptions& o) {
  const bool given = app.count("--stages-per-rank") > 0;
  if (o.pp_schedule == "zbv") {
    if (given && o.stages_per_rank != 2) return "--pp-schedule zbv places 2 stages per rank; drop --stages-per-rank";
    o.stages_per_rank = 2;
  } else if (o.pp_schedule == "interleaved-1f1b") {
    if (!given) o.stages_per_rank = 2;
  } else if (o.stages_per_rank != 1) {
    return "--stages-per-rank " + std::to_string(o.stages_per_rank) + " needs --pp-schedule " +
           "interleaved-1f1b or zbv (" + o.pp_schedule + " runs one stage per rank)";
  }
  return "";
}

}  // namespace

std::string check_pipeline_flags(const CLI::App& app, CommandLine& cl) {
  TrainOptions& o = cl.train;
  if (o.pp == 0) {
    for (const char* flag : {"--pp-schedule", "--stages-per-rank", "--microbatches"}) {
      if (app.count(flag) > 0) return std::string(flag) + " only applies with --pp P";
    }
    return "";
  }
  for (const auto& [given, flag] : not_with_pipeline(app, cl)) {
    if (given) return "--pp does not run with " + flag + "; drop one of them";
  }
  if (cl.autoplan) {
    if (std::string error = check_planned_grad_accum(o); !error.empty()) return error;
  }
  if (std::string error = check_stages_per_rank(app, o); !error.empty()) return error;  // its default first
  if (o.pp_schedule == "zbv" && o.fsdp.activation_checkpointing()) {  // [Note: activation checkpointing inside a stage]
    return "--pp-schedule zbv does not run with --activation-checkpointing: ZBV's input-gradient pass would run the "
           "recomputation's backward, which accumulates the weights' gradients before its weight pass adds them "
           "again; use --pp-schedule gpipe, 1f1b or interleaved-1f1b, or drop --activation-checkpointing";
  }
  return check_pipeline_shape(app, o);
}

std::string check_planned_grad_accum(const TrainOptions& o) {
  if (o.pp == 0 || o.grad_accum == 1) return "";
  return "--pp does not run with --plan/--auto with --grad-accum (the pipelined plan is of one schedule a step; "
         "give --microbatches A·M instead); drop one of them";
}

std::string check_pipeline_shape(const CLI::App& app, TrainOptions& o) {
  if (o.pp == 0) return "";
  if (std::string error = check_stages_per_rank(app, o); !error.empty()) return error;
  const int num_stages = o.pp * o.stages_per_rank;
  if (o.model.layers < num_stages) {
    return "--pp " + std::to_string(o.pp) + " x " + std::to_string(o.stages_per_rank) +
           " stages per rank = " + std::to_string(num_stages) + " stages need --layers >= " +
           std::to_string(num_stages) + " (every stage holds a block), got --layers " +
           std::to_string(o.model.layers);
  }
  try {  // the schedule's own refusals (1F1B with fewer micro-batches than stages, ...)
    fsdp::pp::rank_actions(pipeline_schedule(o.pp_schedule), o.pp, num_stages, o.microbatches, 0);
  } catch (const c10::Error& e) {
    return "--pp-schedule " + o.pp_schedule + " --microbatches " + std::to_string(o.microbatches) +
           ": " + e.msg();
  }
  return "";
}

}  // namespace gpt
