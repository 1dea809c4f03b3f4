// checkpoint_tool: a small GPT trained under fsdprun that resumes from and saves sharded
// checkpoints, printing (rank 0) what tests/checkpoint_e2e.py and bench/checkpoint compare:
//   loss STEP VALUE                       the global loss of every step it trains (%.17g)
//   digest WHEN PARAMS OPTIMIZER          hashes of the full parameters and full AdamW state
//   resumed_step N / load_seconds S / save_seconds S BYTES / stall_seconds S WAVES (--async-save)
//   reused_arena 0/1                      --async-save: staged into an arena made before the save
//   step_seconds STEP S WRITING           a step's time; WRITING 1 while a background write ran
//   save_memory COUNTED RSS / save_fds N  what a save took (--probe, save_probe.h)
#include "data.h"
#include "gpt.h"
#include "checkpointing.h"
#include "save_probe.h"

#include <fsdp/async_checkpoint.h>
#include <fsdp/checkpoint.h>
#include <fsdp/fsdp.h>
#include <fsdp/memory.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string_view>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A hash of every tensor's name and bytes, in name order: equal iff bitwise equal (whp).
size_t digest(const fsdp::NamedTensors& tensors) {
  std::map<std::string, torch::Tensor> sorted(tensors.begin(), tensors.end());
  size_t hash = sorted.size();
  for (const auto& [name, tensor] : sorted) {
    const auto t = tensor.contiguous();
    const std::string_view bytes(static_cast<const char*>(t.data_ptr()), t.nbytes());
    hash = hash * 1000003u ^ std::hash<std::string>{}(name) ^ std::hash<std::string_view>{}(bytes);
  }
  return hash;
}

int64_t folder_bytes(const std::string& folder) {
  int64_t total = 0;
  for (const auto& item : std::filesystem::directory_iterator(folder)) {
    if (item.is_regular_file()) total += static_cast<int64_t>(item.file_size());
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small sharded GPT, resuming from and saving sharded checkpoints."};
  gpt::GPTConfig config;
  config.layers = 2;
  config.dim = 32;
  config.heads = 2;
  config.max_seq = 16;
  std::string data, load_dir, save_dir;
  int64_t batch = 2, steps = 0;
  uint64_t init_seed = 1, data_seed = 7;
  app.add_option("--data", data, "text file or folder")->required();
  app.add_option("--layers", config.layers);
  app.add_option("--dim", config.dim);
  app.add_option("--heads", config.heads);
  app.add_option("--seq", config.max_seq);
  app.add_option("--batch", batch, "rows per rank");
  app.add_option("--steps", steps, "steps to train (after the resumed step)");
  app.add_option("--init-seed", init_seed, "initial weights (a loaded checkpoint replaces them)");
  app.add_option("--data-seed", data_seed, "batches");
  app.add_option("--load", load_dir, "resume from the latest checkpoint in this directory");
  app.add_option("--save", save_dir, "save a checkpoint into this directory at the end");
  std::string full_state_path, batches_path;
  app.add_option("--dump-full-state", full_state_path,
                 "rank 0 writes the full parameters and AdamW state (torch.save) when it saves");
  app.add_option("--dump-batches", batches_path,
                 "rank 0 writes the global batch of every step it trains (x/STEP, y/STEP)");
  std::string strategy = "full";
  int shard_group_size = 0;
  app.add_option("--strategy", strategy, "full | grad_op | none | hybrid | hybrid_grad_op");
  app.add_option("--shard-group-size", shard_group_size, "hybrid: ranks per shard group");
  int64_t pause_after_shard_files_ms = 0;
  app.add_option("--pause-after-shard-files", pause_after_shard_files_ms,
                 "milliseconds each writing rank sleeps between its shard files and the metadata "
                 "of --save (a save the tests kill half-way)");
  bool async_save = false;
  app.add_flag("--async-save", async_save,
               "--save with fsdp::save_checkpoint_async, then wait() (--pause-after-shard-files then "
               "pauses its background thread)");
  bool reserve_arena = false;
  app.add_flag("--reserve-arena", reserve_arena,
               "--async-save: fsdp::reserve_staging_arena after the first step trained");
  int saves = 1;
  int64_t steps_after_save = 0, staging_budget = 0;
  bool probe_save = false;
  app.add_option("--saves", saves, "--save this many times, one step apart (a later save reuses the "
                 "staging arena)");
  app.add_option("--steps-after-save", steps_after_save,
                 "steps trained after each save's call, before its wait() (--async-save: during the write)");
  app.add_option("--staging-budget", staging_budget, "--async-save's staging budget in bytes (0: one rank's shards)");
  app.add_flag("--probe", probe_save, "print save_memory COUNTED RSS (peak bytes over the save's start) and "
               "save_fds N (most file descriptors open at once over the start's)");
  CLI11_PARSE(app, argc, argv);
  if (probe_save) fsdp::install_memory_counter();

  try {
    auto dist = fsdp::init_distributed();
    const bool print = dist->rank() == 0;
    const auto corpus = gpt::ByteCorpus::load(data, 1 << 20, config.max_seq + 2);
    auto gpt_model = gpt::make_gpt(config, init_seed);
    auto optim = gpt::make_optimizer(gpt_model, 3e-3, 0.1);
    auto model = fsdp::fully_shard(gpt_model, *dist->world,
                                   fsdp::FullyShardOptions()
                                       .strategy(fsdp::parse_sharding_strategy(strategy))
                                       .shard_group_size(shard_group_size));
    auto report = [&](const char* when) {
      const auto params = digest(fsdp::gather_full_params(model));
      const auto state = digest(fsdp::gather_full_optimizer_state(model, *optim));
      if (print) std::printf("digest %s %zx %zx\n", when, params, state);
    };

    int64_t step = 0;
    if (!load_dir.empty()) {
      const std::string path = fsdp::latest_checkpoint(load_dir);
      TORCH_CHECK(!path.empty(), "--load: no checkpoint in ", load_dir);
      const auto start = Clock::now();
      step = gpt::saved_step(fsdp::load_sharded(model, *optim, path), path + "/metadata.json");
      if (print) std::printf("resumed_step %lld\nload_seconds %.6f\n", (long long)step, seconds_since(start));
      report("after_load");
    }
    fsdp::NamedTensors batches;
    std::optional<fsdp::AsyncSave> saving;  // a save still writing in the background
    // One step; prints its loss, and its time with whether a background write ran meanwhile.
    auto train_step = [&] {
      const auto start = Clock::now();
      const bool writing = saving && !saving->done();
      auto [x, y] = corpus.batch(data_seed, step, dist->rank() * batch, batch, config.max_seq);
      if (!batches_path.empty()) {
        auto [gx, gy] = corpus.batch(data_seed, step, 0, dist->world_size() * batch, config.max_seq);
        batches.emplace_back("x/" + std::to_string(step), gx);
        batches.emplace_back("y/" + std::to_string(step), gy);
      }
      optim->zero_grad();
      auto loss = gpt::lm_loss(model(x), y);
      loss.backward();
      optim->step();
      auto global = loss.detach().clone();
      fsdp::all_reduce_sum(*dist->world, global);
      if (print) std::printf("loss %lld %.17g\n", (long long)step, global.item<double>() / dist->world_size());
      if (print) std::printf("step_seconds %lld %.6f %d\n", (long long)step, seconds_since(start), writing ? 1 : 0);
      ++step;
    };
    for (const int64_t last = step + steps; step < last;) {
      train_step();
      if (reserve_arena && step == last - steps + 1) {
        fsdp::reserve_staging_arena(model, *optim, fsdp::AsyncSaveOptions().staging_budget_bytes(staging_budget));
      }
    }
    if (!batches_path.empty() && print) fsdp::save_tensor_dict(batches_path, batches);
    for (int s = 0; s < saves && !save_dir.empty(); ++s) {
      if (s > 0) train_step();
      report("at_save");
      if (!full_state_path.empty()) {
        auto full = fsdp::gather_full_params(model);
        for (auto& item : fsdp::gather_full_optimizer_state(model, *optim)) full.push_back(item);
        if (print) fsdp::save_tensor_dict(full_state_path, full);
      }
      std::optional<SaveProbe> probe;
      if (probe_save) {
        fsdp::reset_peak_memory();
        probe.emplace();
      }
      const int64_t counted_before = fsdp::memory_stats().current_bytes;
      const auto start = Clock::now();
      fsdp::SaveHooks hooks;
      if (pause_after_shard_files_ms > 0) {
        hooks.after_shard_files = [pause_after_shard_files_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(pause_after_shard_files_ms));
        };
      }
      std::string folder;
      if (async_save) {
        saving = fsdp::save_checkpoint_async(
            model, *optim, save_dir, step, {{"step", step}}, 0,
            fsdp::AsyncSaveOptions().hooks(hooks).staging_budget_bytes(staging_budget));
        // What training waits for: the staging, not the write.
        if (print) {
          std::printf("stall_seconds %.6f %d\n", seconds_since(start), saving->staged_waves());
          std::printf("reused_arena %d\n", saving->reused_arena() ? 1 : 0);
        }
        for (int64_t k = 0; k < steps_after_save; ++k) train_step();
        saving->wait();
        folder = saving->folder();
      } else {
        folder = fsdp::save_checkpoint(model, *optim, save_dir, step, {{"step", step}}, 0, hooks);
        if (print) std::printf("stall_seconds %.6f 0\n", seconds_since(start));
        for (int64_t k = 0; k < steps_after_save; ++k) train_step();
      }
      if (print) std::printf("save_seconds %.6f %lld\n", seconds_since(start), (long long)folder_bytes(folder));
      if (probe) {
        probe->stop();
        const int64_t counted = fsdp::memory_stats().peak_bytes - counted_before;
        if (print) {
          std::printf("save_memory %lld %lld\nsave_fds %lld\n", (long long)counted,
                      (long long)probe->rss_peak_bytes(), (long long)probe->extra_fds());
        }
      }
    }
    std::fflush(stdout);
  } catch (const c10::Error& e) {
    std::cerr << "checkpoint_tool: error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {  // never "terminate called": one line, whatever threw
    std::cerr << "checkpoint_tool: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
