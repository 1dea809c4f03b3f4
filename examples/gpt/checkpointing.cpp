#include "checkpointing.h"

#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

namespace gpt {

namespace {

namespace fs = std::filesystem;

constexpr int kKeepLast = 2;  // step folders kept: the newest, and one to fall back on

nlohmann::json describe_run(const TrainOptions& o, int64_t next_step) {
  return {{"step", next_step},
          {"seed", o.seed},
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

// A path of the run's own outputs, with {rank} as this process's rank (RANK, or 0).
std::string for_this_rank(std::string path) {
  const char* rank = std::getenv("RANK");
  const std::string token = "{rank}";
  for (size_t at = path.find(token); at != std::string::npos; at = path.find(token)) {
    path.replace(at, token.size(), rank && *rank ? rank : "0");
  }
  return path;
}

// The file `path` can be written: its folder exists and is writable, and it is not a folder.
void check_output_file(const char* flag, const std::string& given) {
  if (given.empty()) return;
  const std::string path = for_this_rank(given);
  std::error_code ec;
  TORCH_CHECK(!fs::is_directory(path, ec), flag, " ", path,
              " is a folder; pass the path of a file to write");
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  TORCH_CHECK(fs::is_directory(folder, ec), flag, " ", path, ": folder ", folder.string(),
              " does not exist (create it first)");
  TORCH_CHECK(::access(folder.c_str(), W_OK) == 0, flag, " ", path, ": folder ", folder.string(),
              " is not writable");
}

void check_input_file(const char* flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), flag, " ", path, ": no such file");
  TORCH_CHECK(fs::is_regular_file(status), flag, " ", path,
              " is not a regular file (a folder, FIFO or device?)");
  TORCH_CHECK(::access(path.c_str(), R_OK) == 0, flag, " ", path, " is not readable");
}

// The `extra` JSON of the checkpoint folder `path`, or null if its metadata cannot be read (the
// load then reports exactly what is wrong with it).
nlohmann::json saved_run(const std::string& path) {
  try {
    const std::vector<char> text = fsdp::read_regular_file(
        path + "/metadata.json", fsdp::kMaxMetadataBytes, "a checkpoint's metadata.json");
    return nlohmann::json::parse(text).at("extra");
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
  TORCH_CHECK(differs.empty(), "--resume: ", path, " was saved by another configuration: ", differs,
              ". Pass the checkpoint's values to continue it, or start a fresh run in another "
              "--checkpoint-dir");
  if (saved.contains("step") && saved["step"].is_number_integer()) {
    const int64_t step = saved["step"].get<int64_t>();
    TORCH_CHECK(step <= o.steps, "--resume: ", path, " is at step ", step, ", past --steps ",
                o.steps, " (raise --steps to train further)");
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

void check_paths(const TrainOptions& o) {
  std::error_code ec;
  // --data: a FIFO would block forever and a device never ends; refuse both before reading.
  TORCH_CHECK(!o.data.empty(), "--data is empty: pass a text file or a folder of text files");
  const auto data = fs::status(o.data, ec);
  TORCH_CHECK(fs::exists(data), "--data ", o.data, ": no such file or folder");
  TORCH_CHECK(fs::is_regular_file(data) || fs::is_directory(data), "--data ", o.data,
              " is not a regular file or a folder (a FIFO or a device cannot be read to an end); "
              "pass a text file or a folder of text files");
  TORCH_CHECK(::access(o.data.c_str(), R_OK) == 0, "--data ", o.data, " is not readable");
  check_input_file("--init-from", o.init_from);
  check_output_file("--metrics", o.metrics_path);
  check_output_file("--save-full", o.save_full);
  check_output_file("--dump-batches", o.dump_batches);
  check_output_file("--trace", o.trace);
  check_input_file("--eval-tokens", o.eval_tokens);
  check_output_file("--eval-out", o.eval_out);

  const std::string& dir = o.checkpoint_dir;
  if (dir.empty()) return;
  const bool exists = fs::exists(dir, ec);
  TORCH_CHECK(!exists || fs::is_directory(dir, ec), "--checkpoint-dir ", dir,
              " is a file, not a folder; pass a folder (created if missing)");
  if (o.resume) {
    const std::string path = exists ? fsdp::latest_checkpoint(dir) : "";
    if (!path.empty() || !o.resume_if_none) {  // else a first run: starts at step 0, says so
      TORCH_CHECK(exists, "--resume: --checkpoint-dir ", dir,
                  " does not exist; to start a fresh run drop --resume (or pass --resume auto)");
      TORCH_CHECK(!path.empty(), "--resume: --checkpoint-dir ", dir,
                  " holds no complete checkpoint; to start a fresh run drop --resume (or pass "
                  "--resume auto)");
      check_same_run(saved_run(path), path, o);
    }
  } else if (exists) {
    const auto found = checkpoint_entries(dir);
    TORCH_CHECK(found.empty(), "--checkpoint-dir ", dir, " already holds checkpoints (",
                found.back(), "...) of another run; a fresh run would overwrite them. Pass "
                "--resume to continue that run, or choose another --checkpoint-dir");
  }
  if (o.save_every > 0) {
    // The folder, or the nearest existing folder above it (the rest is created), is writable.
    fs::path writable = fs::absolute(dir);
    while (!fs::exists(writable, ec) && writable.has_parent_path() && writable != writable.parent_path()) {
      writable = writable.parent_path();
    }
    TORCH_CHECK(fs::is_directory(writable, ec) && ::access(writable.c_str(), W_OK) == 0,
                "--checkpoint-dir ", dir, ": ", writable.string(),
                " is not a writable folder; checkpoints could not be saved there");
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
    TORCH_CHECK(!ec, "--checkpoint-dir ", o.checkpoint_dir, ": cannot create it: ", ec.message());
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
    TORCH_CHECK(o.resume_if_none, "--resume: --checkpoint-dir ", dir, " holds no checkpoint");
    if (rank == 0) {
      std::printf("--resume auto: no checkpoint in %s yet, starting at step 0\n", dir.c_str());
      std::fflush(stdout);
    }
    return 0;
  }
  check_same_run(saved_run(path), path, o);
  const nlohmann::json extra = fsdp::load_sharded(model, optimizer, path);
  const int64_t step = extra.at("step").get<int64_t>();
  TORCH_CHECK(extra.at("seed").get<uint64_t>() == o.seed, path, " was trained with --seed ",
              extra.at("seed").get<uint64_t>(), " but this run has --seed ", o.seed,
              ": its batches would differ (pass --seed ", extra.at("seed").get<uint64_t>(), ")");
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
  fsdp::save_checkpoint(model, optimizer, dir, next_step, describe_run(o, next_step), kKeepLast);
}

}  // namespace gpt
