#pragma once
// gpt_train's command line: every flag, its default and help text, and the options it becomes.

#include "plan_flags.h"
#include "train_options.h"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace gpt {

struct CommandLine {
  TrainOptions train;
  bool reference = false;      // --reference: unsharded, in this process, on the global batch
  std::string device = "cpu";  // --device: cpu | cuda | cuda:N (chosen per rank by main)
  bool cpu_offload = false;

  // Flags whose values `train` holds in another form (finish_options converts them).
  std::string data_tokens;
  std::string optimizer = "fused";
  std::string resume;  // "always" or "auto"; whether --resume was given is the app's count
  int64_t max_data_mb = TrainOptions().max_data_bytes >> 20;
  std::string strategy = "full";
  int shard_group_size = 0;
  std::string backward_prefetch = "pre";
  bool forward_prefetch = true;
  int limit_all_gathers = TrainOptions().fsdp.limit_all_gathers();
  bool keep_after_forward = false;  // --no-reshard-after-forward
  bool check_order = false;
  std::string param_dtype, reduce_dtype;
  bool activation_checkpointing = false;

  // The planner (gpt_train --plan / --auto, fsdp_plan).
  bool plan = false;      // --plan: print the plan of this run and exit
  bool autoplan = false;  // --auto: train with the fastest configuration under --max-memory-gb
  std::vector<std::string> replaced_by_auto;  // given flags --auto chooses anew, e.g. "--strategy none"
  PlanFlags planner;
};

/// Adds every flag of gpt_train to `app`, bound to `cl`.
void add_options(CLI::App& app, CommandLine& cl);

/// The planner's flags (plan_flags.h); with `run_flags`, gpt_train's --plan and --auto too.
void add_planner_options(CLI::App& app, CommandLine& cl, bool run_flags);

/// After parsing, for a plan only (fsdp_plan, gpt_train --plan): fills cl.train from the flags
/// (--init-from-hf's config.json sizes the model) without needing training data. Returns the
/// usage error, "" when there is none.
std::string finish_plan_options(const CLI::App& app, CommandLine& cl);

/// After parsing: fills cl.train from the flags (--data-tokens, --init-from-hf's config.json
/// included) and checks them against each other and this machine, before any work. Returns the
/// usage error, "" when there is none.
std::string finish_options(const CLI::App& app, CommandLine& cl);

}  // namespace gpt
