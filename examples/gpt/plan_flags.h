#pragma once
// The planner's flags, shared by gpt_train (--plan, --auto) and fsdp_plan: the world, the device
// (a preset GPU, given numbers, or a probe of this machine), the links, the memory cap.

#include "train_options.h"

#include <fsdp/plan.h>

#include <CLI/CLI.hpp>

#include <string>

namespace gpt {

struct PlanFlags {
  int ranks = 0;            // 0: the launcher's WORLD_SIZE (1 outside a launcher)
  int ranks_per_host = 0;   // 0: the launcher's LOCAL_WORLD_SIZE, else min(ranks, 8)
  std::string gpu;          // a preset: a100-40gb, a100-80gb, h100-80gb, h200
  double memory_gb = 0;     // per rank; 0: the preset's, or this host's memory / its ranks
  double tflops_fp32 = 0, tflops_bf16 = 0, memory_gbps = 0;  // 0: the preset's, or probed
  double intra_host_gbps = 0, cross_host_gbps = 0, latency_us = 0;  // 0: the preset's/estimate
  double max_memory_gb = 0;  // a cap per rank: search for the fastest configuration under it
  std::string batches;       // the batches per rank a search tries, e.g. "1,2,4" ("": --batch only)
  bool zero_grad_in_place = false;  // the optimizer's gradient shards stay between steps
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

/// The search's candidate batches per rank (--batch alone when none are given).
std::vector<int64_t> search_batches(const PlanFlags& flags, int64_t batch);

}  // namespace gpt
