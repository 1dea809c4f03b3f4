#include "search_flags.h"

namespace gpt {

namespace {

// What a plan without a search uses instead of each search flag.
struct SearchFlag {
  const char* flag;
  const char* searches;  // what the search tries
  const char* single;    // the flag that gives one value without a search
};

constexpr SearchFlag kSearchFlags[] = {
    {"--tp-sizes", "tensor-parallel sizes", "--tp T"},
    {"--batches", "batches per rank", "--batch N"},
};

}  // namespace

std::string check_search_flags(const CLI::App& app, const CommandLine& cl, bool planning) {
  for (const SearchFlag& f : kSearchFlags) {
    if (app.count(f.flag) == 0) continue;
    const std::string flag = f.flag;
    if (planning && cl.planner.max_memory_gb <= 0) {
      return flag + " lists the " + f.searches + " a search under a memory cap tries: it needs " +
             "--max-memory-gb X (without it one configuration is planned: give " + f.single + ")";
    }
    if (!planning && !cl.autoplan) {
      return flag + " applies to a search (--plan or --auto, with --max-memory-gb X); a training "
             "run takes " + f.single;
    }
    if (!planning && flag == "--batches") {
      return "--batches is --plan's search; --auto tries the divisors of --batch (the global batch "
             "kept with gradient accumulation): drop --batches, or set --batch";
    }
  }
  return "";
}

}  // namespace gpt
