#pragma once
// The planner's search flags (--tp-sizes, --batches) act only in a search under --max-memory-gb
// (fsdp_plan, gpt_train --plan; gpt_train --auto has its own batches): given where no search
// reads them they are refused by name, not ignored.

#include "command_line.h"

#include <CLI/CLI.hpp>

#include <string>

namespace gpt {

/// The usage error of a search flag given where nothing reads it, "" when there is none. `planning`:
/// fsdp_plan or gpt_train --plan (else gpt_train trains, with or without --auto).
std::string check_search_flags(const CLI::App& app, const CommandLine& cl, bool planning);

}  // namespace gpt
