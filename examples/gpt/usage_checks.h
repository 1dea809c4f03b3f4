#pragma once
// gpt_train's usage errors: what its flags ask for, checked against each other and this machine
// before any rendezvous or work. Each check returns the message ("" when the flags are fine);
// main prints it and exits with status 2.

#include "train_options.h"

#include <CLI/CLI.hpp>

#include <string>

namespace gpt {

/// --data or --data-tokens into o.data (and whether it holds token ids), and --init-from-hf's
/// sizes from its config.json into o.model (before any check of sizes; it also makes the set-up
/// deferred: the whole model never exists at once).
std::string apply_data_and_hf_flags(const CLI::App& app, const std::string& data_tokens,
                                    TrainOptions& o);

/// Flags that contradict or need each other, and sizes that cannot fit this machine's memory.
/// --init-from-hf: the model's sizes from its config.json (flags given explicitly must agree).
std::string apply_hf_sizes(const CLI::App& app, TrainOptions& o);

std::string check_flag_combinations(const CLI::App& app, const TrainOptions& o, bool reference);

/// --device and --cpu-offload: a GPU run needs a CUDA LibTorch and a GPU.
std::string check_device_flags(const std::string& device, bool cpu_offload, bool reference);

}  // namespace gpt
