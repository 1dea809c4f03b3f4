#include "checkpointing.h"

#include "hf_folder.h"
#include "model_settings.h"
#include "options.h"
#include "saved_freeze.h"
#include "trainer.h"

#include <map>
#include <fsdp/async_checkpoint.h>
#include <fsdp/bounded_json.h>
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>
#include <fsdp/printable.h>
#include <fsdp/run_lock.h>

#include <c10/util/Exception.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <regex>
#include <signal.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace gpt {



namespace {

namespace fs = std::filesystem;

constexpr int kKeepLast = 2;  // step folders kept: the newest, and one to fall back on

// `optimizer_stepped`: whether AdamW has taken a step (fp16's scaler may have skipped every one
// so far): a checkpoint without AdamW state is then complete, not one that lost its state.
nlohmann::json describe_run(const TrainOptions& o, int64_t next_step, bool optimizer_stepped) {
  return {{"step", next_step},
          {"seed", o.seed},
          {"optimizer_stepped", optimizer_stepped},
          {"batch_per_rank", o.batch},  // per data-parallel rank
          {"tp", o.tp},                 // resumable at another --tp (or none): checked on resume
          {"model", model_settings(o.model)}};
}

bool is_step_folder_name(const std::string& name) {
  static const std::regex step_re("step-[0-9]{8}");
  return std::regex_match(name, step_re);
}

// What a run left in `dir`: the `latest` pointer and step folders (complete or not).
std::vector<std::string> checkpoint_entries(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    if (name == "latest" || is_step_folder_name(name)) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The metadata.json of the checkpoint folder `path` (an object), or null if it cannot be read
// (the load then reports exactly what is wrong with it).
nlohmann::json saved_metadata(const std::string& path) {
  try {
    const std::vector<char> text = fsdp::read_regular_file(
        path + "/metadata.json", fsdp::kMaxMetadataBytes, "a checkpoint's metadata.json");
    nlohmann::json meta = fsdp::parse_json_bounded({text.data(), text.size()}, path + "/metadata.json");
    return meta.is_object() ? meta : nullptr;
  } catch (const std::exception&) {
    return nullptr;
  }
}

// A resumed run must be the same model with the same seed; each differing setting is named.
void check_same_run(const nlohmann::json& saved, const std::string& path, const TrainOptions& o) {
  if (!saved.is_object()) return;
  std::string differs;
  if (saved.contains("model") && saved["model"].is_object()) {
    const nlohmann::json mine = model_settings(o.model);
    for (const auto& [setting, value] : saved["model"].items()) {  // an older checkpoint saved fewer
      if (!mine.contains(setting) || mine[setting] == value) continue;
      differs += std::string(differs.empty() ? "" : ", ") + setting_name(setting) + " " +
                 mine[setting].dump() + " (the checkpoint has " + fsdp::json_excerpt(value) + ")";
    }
  }
  if (saved.contains("seed") && saved["seed"].is_number_unsigned() &&
      saved["seed"].get<uint64_t>() != o.seed) {
    differs += std::string(differs.empty() ? "" : ", ") + "--seed " + std::to_string(o.seed) +
               " (the checkpoint has " + std::to_string(saved["seed"].get<uint64_t>()) +
               "; its batches would differ)";
  }
  TORCH_CHECK(differs.empty(), "--resume: ", fsdp::printable(path),
              " was saved by another configuration: ", differs, ". Pass the checkpoint's values to continue it, or start a fresh run in another "
              "--checkpoint-dir");
  if (saved.contains("step") && saved["step"].is_number_integer()) {
    const int64_t step = saved["step"].get<int64_t>();
    TORCH_CHECK(step <= o.steps, "--resume: ", fsdp::printable(path), " is at step ", step,
                ", past --steps ", o.steps, " (raise --steps to train further)");
  }
}

// The optimizers whose state a checkpoint holds, by class: metadata.json's "optimizers" where
// several saved, else its "optimizer" (AdamW in checkpoints older than the field).
std::vector<std::string> saved_optimizers(const nlohmann::json& meta) {
  if (meta.contains("optimizers") && meta["optimizers"].is_array()) {
    std::vector<std::string> names;
    for (const auto& name : meta["optimizers"]) names.push_back(name.is_string() ? name.get<std::string>() : shown_json(name));
    return names;
  }
  const nlohmann::json name = meta.value("optimizer", nlohmann::json("AdamW"));
  return {name.is_string() ? name.get<std::string>() : shown_json(name)};
}

// A run resumes the optimizers it saved with: --optimizer muon's AdamW and Muon, or AdamW alone
// (fused and torch keep the same state). Each parameter's state belongs to one of them. A
// checkpoint of another program's optimizers (Adam, SGD...) is left to load_sharded's message.
void check_same_optimizers(const nlohmann::json& meta, const std::string& path, const TrainOptions& o) {
  const std::vector<std::string> saved = saved_optimizers(meta);
  const bool gpt_train_saved = std::all_of(saved.begin(), saved.end(), [](const std::string& name) {
    return name == "AdamW" || name == "Muon";
  });
  const bool saved_by_muon = std::find(saved.begin(), saved.end(), "Muon") != saved.end();
  if (!gpt_train_saved || saved_by_muon == o.muon) return;
  std::string names;
  for (const std::string& name : saved) names += (names.empty() ? "" : " and ") + name;
  TORCH_CHECK(false, "--resume: ", fsdp::printable(path), " holds the state of ", names,
              ", and this run trains with ", o.muon ? "Muon and AdamW (--optimizer muon)" : "AdamW",
              ": pass --optimizer ", saved_by_muon ? "muon" : "fused (or torch)",
              " to continue it, or start a fresh run in another --checkpoint-dir");
}

// The checkpoint `path` is one this run can continue: the same model, seed and optimizers, and
// what its metadata says makes sense (saved_run.h).
void check_resumable(const std::string& path, const TrainOptions& o) {
  const nlohmann::json meta = saved_metadata(path);
  if (meta.is_null()) return;
  check_same_run(meta.value("extra", nlohmann::json()), path, o);
  check_same_optimizers(meta, path, o);
  check_same_freeze(meta, path, o);
  check_saved_state(meta, path, o);
}

// --optimizer muon saves both optimizers' state in one checkpoint (fsdp::save_checkpoint's
// overload over a list of optimizers: each parameter's state under DCP's names, recorded with its
// optimizer's class), in TrainOptimizers::saved()'s order, which the load passes again. A run with
// AdamW alone saves as before: one optimizer, the same files.
nlohmann::json load_checkpoint(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
                               const std::string& path) {
  if (optimizers.muon) return fsdp::load_sharded(model, optimizers.saved(), path);
  return fsdp::load_sharded(model, *optimizers.adamw, path);
}

// --async-save: fsdp::save_checkpoint_async, completed by the next save; the last one (the run's
// end) waited for at once, so that the run ends with it published.
void save_checkpoint(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers, const std::string& dir,
                     int64_t next_step, const nlohmann::json& extra, const fsdp::SaveHooks& hooks,
                     const TrainOptions& o) {
  if (o.async_save) {
    const auto options = fsdp::AsyncSaveOptions().hooks(hooks).staging_budget_bytes(o.staging_budget);
    auto saving = optimizers.muon
                      ? fsdp::save_checkpoint_async(model, optimizers.saved(), dir, next_step, extra, kKeepLast, options)
                      : fsdp::save_checkpoint_async(model, *optimizers.adamw, dir, next_step, extra, kKeepLast, options);
    if (next_step == o.steps) saving.wait();
    return;
  }
  if (optimizers.muon) {
    fsdp::save_checkpoint(model, optimizers.saved(), dir, next_step, extra, kKeepLast, hooks);
  } else {
    fsdp::save_checkpoint(model, *optimizers.adamw, dir, next_step, extra, kKeepLast, hooks);
  }
}

bool process_exists(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// Removes name.tmp.PID files of processes that no longer exist, in `folder` only.
void remove_stale_temporaries(const fs::path& folder) {
  static const std::regex tmp_re(".*\\.tmp\\.([0-9]+)");
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string name = item.path().filename().string();
    if (!std::regex_match(name, m, tmp_re) || process_exists(std::stol(m[1]))) continue;
    std::error_code removed;
    fs::remove(item.path(), removed);
    if (!removed) {
      std::printf("removed %s, left by a save that was killed\n", item.path().c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace

std::unique_ptr<fsdp::RunLock> lock_checkpoint_dir(const TrainOptions& o, int rank, bool create) {
  const std::string& dir = o.checkpoint_dir;
  if (dir.empty() || rank != 0) return nullptr;
  std::unique_ptr<fsdp::RunLock> lock;
  try {
    fsdp::check_checkpoint_dir_alone(dir);  // before the lock writes into the folder
    std::error_code ec;
    // A run that will not create the folder leaves a missing one to check_checkpoint_dir's error.
    if (!fs::is_directory(dir, ec) && (!create || o.save_every == 0)) return nullptr;
    lock = std::make_unique<fsdp::RunLock>(dir);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--checkpoint-dir: ", e.msg());
  }
  if (!lock->taken_over_from().empty()) {
    std::printf("--checkpoint-dir %s: took over %s from a run that ended without releasing it "
                "(%s)\n", fsdp::printable(dir).c_str(), fsdp::printable(lock->path()).c_str(),
                lock->taken_over_from().c_str());
    std::fflush(stdout);
  }
  return lock;
}

void check_checkpoint_dir(const TrainOptions& o) {
  const std::string& dir = o.checkpoint_dir;
  if (dir.empty()) return;
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  TORCH_CHECK(!exists || fs::is_directory(dir, ec), "--checkpoint-dir ", fsdp::printable(dir),
              " is a file, not a folder; pass a folder (created if missing)");
  if (o.resume) {
    const std::string path = exists ? fsdp::latest_checkpoint(dir) : "";
    if (!path.empty() || !o.resume_if_none) {  // else a first run: starts at step 0, says so
      TORCH_CHECK(exists, "--resume: --checkpoint-dir ", fsdp::printable(dir),
                  " does not exist; to start a fresh run drop --resume (or pass --resume auto)");
      TORCH_CHECK(!path.empty(), "--resume: --checkpoint-dir ", fsdp::printable(dir),
                  " holds no complete checkpoint; to start a fresh run drop --resume (or pass "
                  "--resume auto)");
      check_resumable(path, o);
    }
  } else if (exists) {
    const auto found = checkpoint_entries(dir);
    TORCH_CHECK(found.empty(), "--checkpoint-dir ", fsdp::printable(dir),
                " already holds checkpoints (", found.back(), "...) of another run; a fresh run would overwrite them. Pass "
                "--resume to continue that run, or choose another --checkpoint-dir");
  }
}

void prepare_checkpoint_dir(const TrainOptions& o, int rank) {
  if (o.checkpoint_dir.empty() || rank != 0) return;
  std::error_code ec;
  if (fs::is_directory(o.checkpoint_dir, ec)) {
    remove_stale_temporaries(o.checkpoint_dir);
    for (const auto& item : fs::directory_iterator(o.checkpoint_dir, ec)) {
      if (item.is_directory() && is_step_folder_name(item.path().filename().string())) {
        remove_stale_temporaries(item.path());
      }
    }
  } else if (o.save_every > 0) {
    fs::create_directories(o.checkpoint_dir, ec);
    TORCH_CHECK(!ec, "--checkpoint-dir ", fsdp::printable(o.checkpoint_dir), ": cannot create it: ",
                ec.message());
  }
}

bool checkpoint_due(const TrainOptions& o, int64_t step) {
  if (o.save_every <= 0) return false;
  const int64_t next_step = step + 1;
  return next_step % o.save_every == 0 || next_step == o.steps;
}

int64_t resume_from_checkpoint(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
                               const std::string& dir, const TrainOptions& o, int rank) {
  return resume_with([&](const std::string& path) { return load_checkpoint(model, optimizers, path); },
                     optimizers, dir, o, rank);
}

int64_t resume_with(const LoadCheckpoint& load, TrainOptimizers& optimizers, const std::string& dir,
                    const TrainOptions& o, int rank) {
  TORCH_CHECK(!dir.empty(), "--resume needs --checkpoint-dir");
  const std::string path = fsdp::latest_checkpoint(dir);
  if (path.empty()) {
    TORCH_CHECK(o.resume_if_none, "--resume: --checkpoint-dir ", fsdp::printable(dir),
                " holds no checkpoint");
    if (rank == 0) {
      std::printf("--resume auto: no checkpoint in %s yet, starting at step 0\n", dir.c_str());
      std::fflush(stdout);
    }
    return 0;
  }
  check_resumable(path, o);
  const nlohmann::json extra = load(path);
  const std::string metadata = path + "/metadata.json";
  const int64_t step = saved_step(extra, metadata);
  const uint64_t seed = saved_seed(extra, metadata);
  TORCH_CHECK(seed == o.seed, path, " was trained with --seed ", seed, " but this run has --seed ",
              o.seed, ": its batches would differ (pass --seed ", seed, ")");
  if (o.reset_optimizer) {
    optimizers.clear_state();
    if (rank == 0) {
      std::printf("--reset-optimizer: loaded the parameters of %s; AdamW starts afresh (no "
                  "moments, step 0)\n", path.c_str());
    }
  }
  if (rank == 0) {
    // Another layout reads the same checkpoint ([Note: boxes of a tensor-parallel part]): said.
    const nlohmann::json meta = saved_metadata(path);
    const int tp = saved_tp(meta, metadata);
    const std::string layout = tp == o.tp ? "" : " (saved at --tp " + std::to_string(tp) + ", resumed at --tp " +
                                                     std::to_string(o.tp) + ")";
    std::printf("resumed from %s at step %lld%s%s\n", path.c_str(), static_cast<long long>(step), layout.c_str(),
                step == o.steps ? " (--steps reached: nothing left to train)" : "");
    std::fflush(stdout);
  }
  return step;
}

void reserve_async_staging(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers, const TrainOptions& o) {
  if (!o.async_save) return;
  const auto options = fsdp::AsyncSaveOptions().staging_budget_bytes(o.staging_budget);
  if (optimizers.muon) {
    fsdp::reserve_staging_arena(model, optimizers.saved(), options);
  } else {
    fsdp::reserve_staging_arena(model, *optimizers.adamw, options);
  }
}

void save_checkpoint_if_due(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
                            const std::string& dir, int64_t every, int64_t step,
                            const TrainOptions& o) {
  save_if_due_with(
      [&](int64_t next_step, const nlohmann::json& extra, const fsdp::SaveHooks& hooks) {
        save_checkpoint(model, optimizers, dir, next_step, extra, hooks, o);
      },
      optimizers, dir, every, step, o);
}

void save_if_due_with(const SaveCheckpoint& save, TrainOptimizers& optimizers, const std::string& dir,
                      int64_t every, int64_t step, const TrainOptions& o) {
  if (every <= 0) return;
  TORCH_CHECK(!dir.empty(), "--save-every needs --checkpoint-dir");
  const int64_t next_step = step + 1;
  if (next_step % every != 0 && next_step != o.steps) return;
  fsdp::SaveHooks hooks;
  if (o.test_pause_after_shard_files_ms > 0) {
    hooks.after_shard_files = [ms = o.test_pause_after_shard_files_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
  }
  save(next_step, describe_run(o, next_step, optimizers.has_state()), hooks);
}

namespace {

fsdp::NamedTensors named_parameters(fsdp::Unit<GPT>& model) {
  fsdp::NamedTensors params;
  for (auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  return params;
}

}  // namespace

void save_full(const TrainOptions& o, fsdp::Unit<GPT>& model, fsdp::Distributed* dist) {
  if (dist) {
    fsdp::save_full_params(model, o.save_full);
  } else {
    fsdp::save_tensor_dict(o.save_full, named_parameters(model));
  }
}

fsdp::NamedTensors full_params(fsdp::Unit<GPT>& model, fsdp::Distributed* dist) {
  if (dist) return fsdp::gather_full_params(model);
  fsdp::NamedTensors params = named_parameters(model);
  for (auto& [name, tensor] : params) tensor = tensor.detach().clone();
  return params;
}

void export_hf(const TrainOptions& o, const fsdp::NamedTensors& full_params,
               fsdp::Distributed* dist) {
  std::string error;
  if (!dist || dist->rank() == 0) {
    try {
      const nlohmann::json base = o.init_from_hf.empty()
                                      ? nlohmann::json()
                                      : HfConfig::read_json(o.init_from_hf);
      write_hf_folder(full_params, o.model, base, o.export_hf);
    } catch (const std::exception& e) {
      error = fsdp::message_of(e);
    }
  }
  auto failed = torch::full({1}, error.empty() ? 0.0f : 1.0f);
  if (dist) fsdp::all_reduce_sum(*dist->world, failed);
  TORCH_CHECK(failed.item<float>() == 0.0f,
              output_failed("--export-hf", o.export_hf, error.empty() ? "on rank 0" : error));
}

}  // namespace gpt
