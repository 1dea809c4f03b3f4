#pragma once
// gpt_train's command line, decoded once into typed options: every flag, its default and help
// text, the checks of a flag's text before CLI11 converts it, and the usage errors (flags that
// contradict each other or this machine) found before any rendezvous or work.

#include "gpt_plan.h"
#include "options.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

// gpt_train's checks of a flag's text before CLI11 converts it, so that a negative count, a NaN
// or an infinity is refused before any work with a message that names the flag (CLI11 prefixes
// the flag's name: "--lr: must be a finite number >= 0, got 'inf'").
constexpr int64_t kMaxCount = int64_t(1) << 40;  // steps and the like: far beyond any real run

/// A whole number in [lo, hi]; `hint`, when given, ends the message in parentheses.
CLI::Validator integer_in(int64_t lo, int64_t hi, std::string hint = "");

/// A finite number >= lo (> lo when `strictly_above`).
CLI::Validator real_at_least(double lo, bool strictly_above = false, std::string hint = "");

/// A finite number in [lo, hi]: a rate or a size whose absurd values (1e-300 TFLOP/s, 1e300
/// GiB) would print as 300-digit times or "inf GiB".
CLI::Validator real_in(double lo, double hi, std::string hint = "");

/// --device: "cpu", "cuda" or "cuda:N".
CLI::Validator device_name();

// gpt_train's command line: every flag, its default and help text, and the options it becomes.
struct CommandLine {
  TrainOptions train;
  bool reference = false;      // --reference: unsharded, in this process, on the global batch
  std::string device = "cpu";  // --device: cpu | cuda | cuda:N (chosen per rank by main)
  bool cpu_offload = false;

  // Flags whose values `train` holds in another form (finish_options converts them).
  std::string model = "gpt2";  // --model: a family's name (model_family.h), gpt2 | llama
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

/// --pp, --pp-schedule, --stages-per-rank, --microbatches (pipeline_flags.cpp).
void add_pipeline_options(CLI::App& app, CommandLine& cl);
/// --pp's flags against the schedule and the model, and the flags that do not run with --pp yet
/// (each named with why); sets the schedule's default --stages-per-rank. "" when fine.
std::string check_pipeline_flags(const CLI::App& app, CommandLine& cl);
/// The pipeline's shape (--stages-per-rank defaulted for the schedule, enough --layers, the
/// schedule's own refusals of --microbatches), for a run and for a plan; "" when there is no --pp.
std::string check_pipeline_shape(const CLI::App& app, TrainOptions& o);
/// --plan/--auto under --pp with --grad-accum: refused (the pipelined plan is of one schedule a step).
std::string check_planned_grad_accum(const TrainOptions& o);

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

// gpt_train's usage errors: what its flags ask for, checked against each other and this machine
// before any rendezvous or work. Each check returns the message ("" when the flags are fine);
// main prints it and exits with status 2.
/// --data or --data-tokens into o.data (and whether it holds token ids), and --init-from-hf's
/// sizes from its config.json into o.model (before any check of sizes; it also makes the set-up
/// deferred: the whole model never exists at once).
std::string apply_data_and_hf_flags(const CLI::App& app, const std::string& data_tokens,
                                    TrainOptions& o);

/// Flags that contradict or need each other, and sizes that cannot fit this machine's memory.
/// --init-from-hf: the model's sizes from its config.json (flags given explicitly must agree).
std::string apply_hf_sizes(const CLI::App& app, TrainOptions& o);

std::string check_flag_combinations(const CLI::App& app, const TrainOptions& o, bool reference);

/// The model's flags: a family's own (ModelFamily::flags) only with its --model, --dim a multiple
/// of --heads, and the family's checks (a Llama's --kv-heads dividing --heads, an even head size).
std::string check_model_flags(const CLI::App& app, const GPTConfig& model);

/// --device and --cpu-offload: a GPU run needs a CUDA LibTorch and a GPU.
std::string check_device_flags(const std::string& device, bool cpu_offload, bool reference);

}  // namespace gpt
