// fsdp_plan: what an FSDP run will cost before it starts (fsdp::plan), for a GPT given by
// gpt_train's flags (--layers/--dim/--heads/--seq/--vocab, or --init-from-hf's config.json) on a
// world of --ranks, --ranks-per-host, and a --gpu preset or this machine probed. Prints each rank's
// peak memory broken down, the bytes each collective sends per step and the step time; with
// --max-memory-gb, the fastest configuration under that cap, the runner-up and why the rest lose.
// Any other model: --model-json, a description (--write-model-json writes the GPT's as a start).
#include "gpt_plan.h"
#include "command_line.h"

#include <fsdp/bounded_json.h>
#include <fsdp/file_checks.h>
#include <fsdp/tensor_file.h>

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <iostream>

namespace {

struct ModelSource {
  bool min_gpt = false;     // --mingpt
  std::string json;         // --model-json: a description instead of the GPT flags
  std::string write_json;   // --write-model-json: the description planned, for editing
};

// A description of the largest GPT (1024 blocks) is ~2 MB; a larger file is none, refused unread.
constexpr int64_t kMaxModelJsonBytes = int64_t{16} << 20;

nlohmann::json read_json(const std::string& path) {
  const std::vector<char> text =
      fsdp::read_regular_file(path, kMaxModelJsonBytes, "--model-json's model description");
  try {
    return fsdp::parse_json_bounded({text.data(), text.size()}, "--model-json " + path);
  } catch (const nlohmann::json::parse_error& e) {
    TORCH_CHECK(false, "--model-json ", path, ": not JSON (", e.what(), ")");
  }
}

// The description's errors name its JSON path; the file is named here.
fsdp::PlanModel model_of_json(const std::string& path) {
  const nlohmann::json json = read_json(path);
  try {
    return fsdp::plan_model_from_json(json);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--model-json ", path, ": ", e.what_without_backtrace());
  }
}

// --write-model-json replaces a file (atomically: a new file renamed over it); anything else at
// the path (a FIFO would block the write forever, a folder cannot be replaced) is refused.
void write_json(const std::string& path, const nlohmann::json& description) {
  struct stat info {};
  TORCH_CHECK(::lstat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode), "--write-model-json ",
              path, " exists and is not a regular file (a FIFO, a folder, a device or a link): "
              "name a new file or a regular one to replace");
  const std::string text = description.dump(2) + "\n";
  fsdp::write_file_atomically(path, std::vector<char>(text.begin(), text.end()));
}

int run(gpt::CommandLine& cl, const ModelSource& source) {
  const gpt::TrainOptions& o = cl.train;
  fsdp::PlanSetup setup = gpt::setup_of_flags(o, cl.planner);
  TORCH_CHECK(cl.planner.tp_sizes.empty() || (!source.min_gpt && source.json.empty()), "--tp-sizes searches "
              "TP sizes of the GPT the flags describe, not of --mingpt or --model-json; give --tp instead");
  if (source.min_gpt) {  // the paper's minGPT: the same flags, its blocks' activations
    setup.model = gpt::describe_gpt(o.model, setup.model.compute_dtype, setup.model.resident_bytes,
                                    gpt::GptCode::MinGpt, setup.policy.tp_size);
  }
  if (!source.json.empty()) setup.model = model_of_json(source.json);
  if (!source.write_json.empty()) write_json(source.write_json, fsdp::plan_model_json(setup.model));
  gpt::print_plan(o, setup, cl.planner);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plan an FSDP run of a GPT: peak memory per rank, bytes per step, step time; with "
               "--max-memory-gb, the fastest configuration that fits. Takes gpt_train's flags."};
  gpt::CommandLine command_line;
  gpt::add_options(app, command_line);
  gpt::add_planner_options(app, command_line, /*run_flags=*/false);
  ModelSource source;
  app.add_flag("--mingpt", source.min_gpt,
               "count activations as minGPT's blocks keep them (the paper's model: attention scores, "
               "dropout, elementwise GELU, untied head)")
      ->group("Planner");
  app.add_option("--model-json", source.json,
                 "plan this model description (fsdp::plan_model_json's format) instead of the GPT flags")
      ->group("Planner");
  app.add_option("--write-model-json", source.write_json,
                 "write the description planned (a start for describing another model)")
      ->group("Planner");
  CLI11_PARSE(app, argc, argv);
  if (const std::string error = gpt::finish_plan_options(app, command_line); !error.empty()) {
    std::cerr << "fsdp_plan: error: " << error << std::endl;
    return 2;
  }
  try {
    return run(command_line, source);
  } catch (const c10::Error& e) {
    std::cerr << "fsdp_plan: error: " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "fsdp_plan: error: " << e.what() << std::endl;
  }
  return 1;
}
