#pragma once
// The planner's side of gpt_train (fsdp::PlanModel, fsdp::plan): the GPT described from its layer
// table (gpt_layers) with what each block, the embeddings and the head keep for backward, counted
// op by op from gpt.cpp ([Note: GPT activations] in gpt_plan.cpp); the planner's flags, shared
// with fsdp_plan; and gpt_train --plan / --auto.

#include "options.h"
#include "trainer.h"

#include <fsdp/distributed.h>
#include <fsdp/plan.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace gpt {

// The planner's view of gpt_train's GPT (fsdp::PlanModel): parameters by unit from the model's
// layer table (gpt_layers), and what each block, the embeddings and the head keep for backward, counted
// op by op from gpt.cpp ([Note: GPT activations] in gpt_plan.cpp).
/// The GPT of `config` computing in `compute_dtype`; `resident_bytes`: the program's own tensors
/// (the training data). With `tp` > 1, one of `tp` tensor-parallel ranks' share of it (the
/// trainer's plan, sequence parallel: docs/planner.md "Tensor parallelism").
fsdp::PlanModel describe_gpt(const GPTConfig& config, c10::ScalarType compute_dtype, int64_t resident_bytes,
                             GptCode code = GptCode::ThisProject, int64_t tp = 1);

/// Throws naming the flag when `tp` does not divide what TP splits: --heads, --kv-heads, --vocab,
/// the MLP's width, --seq (the trainer's check_tensor_parallel).
void check_tp_size(const GPTConfig& config, int64_t tp);

/// The TP sizes a search tries for `config`: those that divide the ranks per host, the world
/// and what check_tp_size checks.
std::vector<int> tp_sizes_for(const GPTConfig& config, int world, int ranks_per_host);

/// The bytes of training data gpt_train will hold for `o` (its --data, up to --max-data-mb).
int64_t training_data_bytes(const TrainOptions& o);

/// The setup of a run of `o` on `world` ranks, `ranks_per_host` to a host.
fsdp::PlanSetup plan_setup(const TrainOptions& o, int world, int ranks_per_host,
                           const fsdp::PlanDevice& device, const fsdp::PlanLinks& links);

// The planner's flags, shared by gpt_train (--plan, --auto) and fsdp_plan: the world, the device
// (a preset GPU, given numbers, or a probe of this machine), the links, the memory cap.
struct PlanFlags {
  int ranks = 0;            // 0: the launcher's WORLD_SIZE (1 outside a launcher)
  int ranks_per_host = 0;   // 0: the launcher's LOCAL_WORLD_SIZE, else min(ranks, 8)
  std::string gpu;          // a preset: a100-40gb, a100-80gb, h100-80gb, h200
  double memory_gb = 0;     // per rank; 0: the preset's, or this host's memory / its ranks
  double tflops_fp32 = 0, tflops_bf16 = 0, memory_gbps = 0;  // 0: the preset's, or probed
  double intra_host_gbps = 0, cross_host_gbps = 0, latency_us = 0;  // 0: the preset's/estimate
  double max_memory_gb = 0;  // a cap per rank: search for the fastest configuration under it
  std::string batches;       // the batches per rank a search tries, e.g. "1,2,4" ("": --batch only)
  std::string tp_sizes;      // the TP sizes a search tries: "2,4", "all" ("": --tp only)
  bool zero_grad_in_place = false;  // the optimizer's gradient shards stay between steps
  bool pp_stages_only = false;  // --pp: plan a program that keeps its stages only (not gpt_train's whole model)
  bool json = false;
};

/// Adds the flags above to `app` (in a group "Planner").
void add_plan_flags(CLI::App& app, PlanFlags& flags);

/// The world of a plan: the flags, else the launcher's variables, else one rank.
fsdp::PlanWorld plan_world(const PlanFlags& flags);

/// The device of a plan: a preset, overridden by given numbers; without either, this machine
/// probed for a few seconds at the model's shapes (fsdp::probe_device).
fsdp::PlanDevice plan_device(const PlanFlags& flags, const TrainOptions& o, const fsdp::PlanWorld& world);

/// The links: a preset's NVLink and network, or given, else estimated from the device (ranks of a
/// CPU host exchange through shared memory: half its memory bandwidth) and a 10 Gb/s network.
fsdp::PlanLinks plan_links(const PlanFlags& flags, const fsdp::PlanDevice& device);

/// Rank 0's device numbers on every rank (a probe differs a little from rank to rank): every
/// rank then plans alike (a collective).
fsdp::PlanDevice shared_device(fsdp::PlanDevice device, fsdp::Distributed& dist);
/// The search's candidate batches per rank (--batch alone when none are given).
std::vector<int64_t> search_batches(const PlanFlags& flags, int64_t batch);

/// The planner's model of run `o` at --tp `tp`: its family's description at the run's compute
/// dtype, --freeze's parameters marked frozen.
fsdp::PlanModel describe_run_model(const TrainOptions& o, int tp);

/// The search's TP sizes (--tp-sizes; "all": tp_sizes_for's), each with the GPT described for it.
void search_tp_sizes(const PlanFlags& flags, const TrainOptions& o, const fsdp::PlanSetup& setup,
                     fsdp::SearchSpace& space);

// gpt_train --plan and --auto: the plan of the run its flags describe, or the fastest configuration
// under --max-memory-gb, and at the end of an --auto run the plan against what the run measured.
/// The setup of the run `o` describes under `flags`: world, device (probed unless the flags give
/// it), links, the GPT's description.
fsdp::PlanSetup setup_of_flags(const TrainOptions& o, const PlanFlags& flags);

/// Prints the plan of `setup` (or, with --max-memory-gb, the search around it: strategies,
/// activation checkpointing, --batches, --tp-sizes (the GPT of `o`), offload on a GPU); --json for
/// programs.
void print_plan(const TrainOptions& o, const fsdp::PlanSetup& setup, const PlanFlags& flags);

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
