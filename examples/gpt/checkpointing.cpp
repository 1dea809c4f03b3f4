#include "checkpointing.h"

#include "saved_run.h"

#include <fsdp/bounded_json.h>
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>
#include <fsdp/printable.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

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
          {"batch_per_rank", o.batch},
          {"model", {{"layers", o.model.layers}, {"dim", o.model.dim}, {"heads", o.model.heads},
                     {"seq", o.model.max_seq}, {"vocab", o.model.vocab_size}}}};
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

// A resumed run must be the same model with the same seed; each differing flag is named.
void check_same_run(const nlohmann::json& saved, const std::string& path, const TrainOptions& o) {
  if (!saved.is_object()) return;
  std::string differs;
  const auto compare = [&](const char* flag, const nlohmann::json& value, int64_t mine) {
    if (value.is_number_integer() && value.get<int64_t>() != mine) {
      differs += std::string(differs.empty() ? "" : ", ") + flag + " " + std::to_string(mine) +
                 " (the checkpoint has " + std::to_string(value.get<int64_t>()) + ")";
    }
  };
  if (saved.contains("model") && saved["model"].is_object()) {
    const auto& model = saved["model"];
    compare("--layers", model.value("layers", nlohmann::json()), o.model.layers);
    compare("--dim", model.value("dim", nlohmann::json()), o.model.dim);
    compare("--heads", model.value("heads", nlohmann::json()), o.model.heads);
    compare("--seq", model.value("seq", nlohmann::json()), o.model.max_seq);
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

// The checkpoint `path` is one this run can continue: the same model and seed, and what its
// metadata says makes sense (saved_run.h).
void check_resumable(const std::string& path, const TrainOptions& o) {
  const nlohmann::json meta = saved_metadata(path);
  if (meta.is_null()) return;
  check_same_run(meta.value("extra", nlohmann::json()), path, o);
  check_saved_state(meta, path, o);
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

int64_t resume_from_checkpoint(fsdp::Unit<GPT>& model, torch::optim::AdamW& optimizer,
                               const std::string& dir, const TrainOptions& o, int rank) {
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
  const nlohmann::json extra = fsdp::load_sharded(model, optimizer, path);
  const std::string metadata = path + "/metadata.json";
  const int64_t step = saved_step(extra, metadata);
  const uint64_t seed = saved_seed(extra, metadata);
  TORCH_CHECK(seed == o.seed, path, " was trained with --seed ", seed, " but this run has --seed ",
              o.seed, ": its batches would differ (pass --seed ", seed, ")");
  if (o.reset_optimizer) {
    optimizer.state().clear();
    if (rank == 0) {
      std::printf("--reset-optimizer: loaded the parameters of %s; AdamW starts afresh (no "
                  "moments, step 0)\n", path.c_str());
    }
  }
  if (rank == 0) {
    std::printf("resumed from %s at step %lld%s\n", path.c_str(), static_cast<long long>(step),
                step == o.steps ? " (--steps reached: nothing left to train)" : "");
    std::fflush(stdout);
  }
  return step;
}

void save_checkpoint_if_due(fsdp::Unit<GPT>& model, torch::optim::AdamW& optimizer,
                            const std::string& dir, int64_t every, int64_t step,
                            const TrainOptions& o) {
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
  fsdp::save_checkpoint(model, optimizer, dir, next_step, describe_run(o, next_step, !optimizer.state().empty()), kKeepLast,
                        hooks);
}

}  // namespace gpt
