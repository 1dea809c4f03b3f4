// fsdp_plan: what an FSDP run will cost before it starts (fsdp::plan), for a GPT given by
// gpt_train's flags (--layers/--dim/--heads/--seq/--vocab, or --init-from-hf's config.json) on a
// world of --ranks, --ranks-per-host, and a --gpu preset or this machine probed. Prints each rank's
// peak memory broken down, the bytes each collective sends per step and the step time; with
// --max-memory-gb, the fastest configuration under that cap, the runner-up and why the rest lose.
#include "auto_plan.h"
#include "command_line.h"
#include "gpt_plan.h"

#include <CLI/CLI.hpp>

#include <iostream>

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

int run(gpt::CommandLine& cl, bool min_gpt) {
  const gpt::TrainOptions& o = cl.train;
  if (!min_gpt) {
    gpt::print_plan(o, cl.planner);
    return 0;
  }
  // The paper's minGPT: the same flags, its blocks' activations.
  const fsdp::PlanWorld world = gpt::plan_world(cl.planner);
  const fsdp::PlanDevice device = gpt::plan_device(cl.planner, o, world);
  fsdp::PlanSetup setup = gpt::plan_setup(o, world.world_size, world.ranks_per_host, device,
                                          gpt::plan_links(cl.planner, device));
  setup.model = gpt::describe_gpt(o.model, setup.model.compute_dtype, setup.model.resident_bytes,
                                  gpt::GptCode::MinGpt);
  if (cl.planner.max_memory_gb > 0) {
    fsdp::SearchSpace space;
    space.batches = gpt::search_batches(cl.planner, o.batch);
    const double cap = cl.planner.max_memory_gb * kGiB;
    const auto result = fsdp::search_plans(setup, space, cap);
    std::cout << (cl.planner.json ? fsdp::search_json(result, cap).dump(2) + "\n" : fsdp::search_text(result, cap));
    return 0;
  }
  const fsdp::Plan plan = fsdp::plan(setup);
  std::cout << (cl.planner.json ? fsdp::plan_json(plan).dump(2) + "\n" : fsdp::plan_text(plan));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plan an FSDP run of a GPT: peak memory per rank, bytes per step, step time; with "
               "--max-memory-gb, the fastest configuration that fits. Takes gpt_train's flags."};
  gpt::CommandLine command_line;
  gpt::add_options(app, command_line);
  gpt::add_planner_options(app, command_line, /*run_flags=*/false);
  bool min_gpt = false;
  app.add_flag("--mingpt", min_gpt,
               "count activations as minGPT's blocks keep them (the paper's model: attention scores, "
               "dropout, elementwise GELU, untied head)")
      ->group("Planner");
  CLI11_PARSE(app, argc, argv);
  if (const std::string error = gpt::finish_plan_options(app, command_line); !error.empty()) {
    std::cerr << "fsdp_plan: error: " << error << std::endl;
    return 2;
  }
  try {
    return run(command_line, min_gpt);
  } catch (const c10::Error& e) {
    std::cerr << "fsdp_plan: error: " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "fsdp_plan: error: " << e.what() << std::endl;
  }
  return 1;
}
