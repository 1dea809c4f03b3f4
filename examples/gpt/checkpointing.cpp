#include "checkpointing.h"

#include "hf_folder.h"
#include "model_settings.h"
#include "options.h"
#include "saved_freeze.h"
#include "trainer.h"

#include <map>
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

/// A path the run uses: one file, or a folder and everything below it.
struct PathUse {
  std::string flag;  // "--metrics"
  std::string path;  // as given, {rank} replaced
  bool folder = false;
  bool output = false;
};

// "no such file", or why it cannot be reached (a folder above it this user may not enter).
std::string why_missing(const std::error_code& ec, const char* what) {
  if (!ec || ec == std::errc::no_such_file_or_directory) return std::string("no such ") + what;
  return "cannot be reached (" + ec.message() + "; a folder above it may not be open to this user)";
}

void check_input_file(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), flag, " ", path, ": ", why_missing(ec, "file"));
  TORCH_CHECK(fs::is_regular_file(status), flag, " ", path,
              " is not a regular file (a folder, FIFO or device?)");
  TORCH_CHECK(::access(path.c_str(), R_OK) == 0, flag, " ", path, " is not readable");
}

// --data: a FIFO would block forever and a device never ends; refuse both before reading.
void check_data(const TrainOptions& o) {
  const std::string& flag = o.data_flag;
  TORCH_CHECK(!o.data.empty(), flag, " is empty: pass a text file or a folder of text files");
  std::error_code ec;
  const auto status = fs::status(o.data, ec);
  TORCH_CHECK(fs::exists(status), flag, " ", o.data, ": ", why_missing(ec, "file or folder"));
  TORCH_CHECK(fs::is_regular_file(status) || (fs::is_directory(status) && !o.data_is_tokens),
              flag, " ", o.data, " is not a regular file", o.data_is_tokens ? "" : " or a folder",
              " (a FIFO or a device cannot be read to an end); pass ",
              o.data_is_tokens ? "a token file" : "a text file or a folder of text files");
  TORCH_CHECK(::access(o.data.c_str(), R_OK) == 0, flag, " ", o.data, " is not readable");
}

// The file `path` can be written: its folder exists and is writable, and it is not a folder.
void check_output_file(const std::string& flag, const std::string& path) {
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

// The folder `path` is one, or can be created: the nearest existing folder above it is writable.
void check_output_folder(const std::string& flag, const std::string& path) {
  std::error_code ec;
  TORCH_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec), flag, " ", path,
              " is a file, not a folder; pass a folder (created if missing)");
  fs::path writable = fs::absolute(path);
  while (!fs::exists(writable, ec) && writable.has_parent_path() &&
         writable != writable.parent_path()) {
    writable = writable.parent_path();
  }
  TORCH_CHECK(fs::is_directory(writable, ec) && ::access(writable.c_str(), W_OK) == 0, flag, " ",
              path, ": ", writable.string(), " is not a writable folder; nothing could be written "
              "there");
}

// A per-rank output written by every rank needs {rank} in its name when there are several.
void check_per_rank(const std::string& flag, const std::string& path, int world_size) {
  TORCH_CHECK(path.find("{rank}") != std::string::npos || world_size == 1, flag, " ", path,
              ": all ", world_size, " ranks would write this one file over each other; put "
              "{rank} in its name (e.g. ", fs::path(path).stem().string(), ".rank{rank}",
              fs::path(path).extension().string(), "), which each rank replaces with its own rank");
}

std::vector<PathUse> path_uses(const TrainOptions& o, int rank) {
  std::error_code ec;
  std::vector<PathUse> uses;
  const auto use = [&](const std::string& flag, const std::string& path, bool folder, bool output) {
    if (!path.empty()) uses.push_back({flag, path, folder, output});
  };
  use(o.data_flag, o.data, fs::is_directory(o.data, ec), false);
  use("--init-from", o.init_from, false, false);
  use("--init-from-hf", o.init_from_hf, true, false);
  use("--eval-tokens", o.eval_tokens, false, false);
  use("--checkpoint-dir", o.checkpoint_dir, true, true);  // read by --resume, written by saves
  // Its lock file, written by the lock: a hard link there would be written through.
  if (!o.checkpoint_dir.empty()) {
    use("--checkpoint-dir", fsdp::RunLock::path_in(o.checkpoint_dir), false, true);
  }
  use("--export-hf", o.export_hf, true, true);
  use("--metrics", for_rank(o.metrics_path, rank), false, true);
  use("--trace", for_rank(o.trace, rank), false, true);
  use("--save-full", o.save_full, false, true);
  use("--dump-batches", o.dump_batches, false, true);
  use("--eval-out", o.eval_out, false, true);
  return uses;
}

// The path with links resolved as far as it exists (the rest as written, normalised).
fs::path resolved(const std::string& path) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal() : out;
}

bool same_file(const PathUse& a, const PathUse& b) {
  std::error_code ec;
  return resolved(a.path) == resolved(b.path) || fs::equivalent(a.path, b.path, ec);  // hard links
}

// `inner` is `folder` or lies below it.
bool lies_in(const PathUse& inner, const PathUse& folder) {
  if (!folder.folder) return false;
  std::string f = resolved(folder.path).string();
  const std::string p = resolved(inner.path).string();
  while (f.size() > 1 && f.back() == '/') f.pop_back();
  return p == f || p.rfind(f == "/" ? f : f + "/", 0) == 0;
}

std::string both(const PathUse& a, const PathUse& b) {
  return a.flag + " " + fsdp::printable(a.path) + " and " + b.flag + " " + fsdp::printable(b.path);
}

// An output must not be an input, lie in an input folder or hold an input; two outputs must not
// be one file (each would overwrite the other).
void check_no_overlap(const std::vector<PathUse>& uses) {
  for (size_t i = 0; i < uses.size(); ++i) {
    for (size_t j = 0; j < uses.size(); ++j) {
      const PathUse& out = uses[i];
      const PathUse& other = uses[j];
      if (i == j || !out.output) continue;
      TORCH_CHECK(!(same_file(out, other) && (!other.output || i < j)), both(out, other),
                  " are the same ", out.folder || other.folder ? "path" : "file",
                  ": the run would ", other.output ? "write both into one" : "overwrite its own input",
                  "; pass another ", out.flag);
      if (other.output) continue;
      TORCH_CHECK(!lies_in(out, other), out.flag, " ", fsdp::printable(out.path),
                  " lies inside the ", other.flag, " folder ", fsdp::printable(other.path),
                  ": the run would write into its own input (and read it back next time); pass a "
                  "path outside it");
      TORCH_CHECK(!lies_in(other, out), other.flag, " ", fsdp::printable(other.path),
                  " lies inside the ", out.flag, " folder ", fsdp::printable(out.path),
                  ", which the run writes into; move one of them");
    }
  }
}

}  // namespace

std::string for_rank(std::string path, int rank) {
  const std::string token = "{rank}";
  for (size_t at = path.find(token); at != std::string::npos; at = path.find(token)) {
    path.replace(at, token.size(), std::to_string(rank));
  }
  return path;
}

void check_paths(const TrainOptions& o, int rank, int world_size) {
  check_data(o);
  if (!o.init_from.empty()) check_input_file("--init-from", o.init_from);
  if (!o.eval_tokens.empty()) check_input_file("--eval-tokens", o.eval_tokens);
  for (const auto& [flag, path] : {std::pair{"--metrics", o.metrics_path}, {"--trace", o.trace}}) {
    if (path.empty()) continue;
    check_per_rank(flag, path, world_size);
    check_output_file(flag, for_rank(path, rank));
  }
  for (const auto& [flag, path] : {std::pair{"--save-full", o.save_full},
                                   {"--dump-batches", o.dump_batches}, {"--eval-out", o.eval_out}}) {
    if (!path.empty()) check_output_file(flag, path);
  }
  if (!o.export_hf.empty()) check_output_folder("--export-hf", o.export_hf);
  if (!o.checkpoint_dir.empty() && o.save_every > 0) {
    check_output_folder("--checkpoint-dir", o.checkpoint_dir);
  }
  check_no_overlap(path_uses(o, rank));
}

namespace {

// A JSON value for a message: at most 40 characters of it (a user's file may hold anything).
std::string shown(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

// extra.FIELD, an integer in [lo, hi]; throws naming the file and the field.
nlohmann::json saved_integer(const nlohmann::json& extra, const char* field, int64_t lo,
                             uint64_t hi, const std::string& metadata, const char* what) {
  TORCH_CHECK(extra.is_object() && extra.contains(field), metadata, " has no extra.", field, " (",
              what, "): the file was edited or not written by gpt_train; resume from an intact "
              "checkpoint");
  const nlohmann::json& value = extra[field];
  // A non-negative JSON integer is unsigned: both bounds hold for it too (extra.tp: 0 divided).
  const bool in_range = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= hi && (lo <= 0 || value.get<uint64_t>() >= static_cast<uint64_t>(lo))
                            : value.is_number_integer() && value.get<int64_t>() >= lo;
  TORCH_CHECK(in_range, metadata, ": extra.", field, " is ", shown(value), ", not an integer from ",
              lo, " to ", hi, " (", what, "): the file was edited; resume from an intact "
              "checkpoint");
  return value;
}

// The step of a folder named step-NNNNNNNN; -1 for any other name.
int64_t folder_step(const std::string& folder) {
  static const std::regex step_re("step-([0-9]{8})");
  std::smatch m;
  const std::string name = std::filesystem::path(folder).filename().string();
  return std::regex_match(name, m, step_re) ? std::stoll(m[1]) : -1;
}

// The name of a saved parameter (metadata.json "params"), for a message.
std::string saved_name(const nlohmann::json& param) {
  const nlohmann::json named = param.contains("name") ? param["name"] : nlohmann::json();
  return named.is_string() && named.get<std::string>().size() <= 200 ? named.get<std::string>()
                                                                       : shown(named);
}

// The class of the optimizer that held a saved parameter: its own "optimizer" where several
// optimizers saved (--optimizer muon: "Muon" or "AdamW"; null: none held it), else AdamW, the
// only one of a gpt_train run with one optimizer.
std::string saved_optimizer_of(const nlohmann::json& param) {
  if (!param.contains("optimizer")) return "AdamW";
  return param["optimizer"].is_string() ? param["optimizer"].get<std::string>() : "";
}

// The AdamW state of one saved parameter, against the run's step.
void check_adamw_step(const nlohmann::json& param, int64_t step, bool optimizer_stepped,
                      const std::string& metadata, const TrainOptions& o) {
  const std::string name = saved_name(param);
  const nlohmann::json adamw =
      param.contains("optimizer_step") ? param["optimizer_step"] : nlohmann::json();
  if (adamw.is_null()) {
    TORCH_CHECK(!optimizer_stepped || is_frozen(o, name), metadata, ": parameter '", name, "' trains but has no AdamW "
                "state (optimizer_step null): it was frozen in the saved run (resume with its --freeze), or the "
                "checkpoint was saved without it or edited, and AdamW would restart silently; pass "
                "--reset-optimizer to restart AdamW from these parameters on purpose, or resume from a "
                "complete checkpoint");
    return;
  }
  TORCH_CHECK(adamw.is_number_integer() && adamw.get<int64_t>() >= 1 &&
                  adamw.get<int64_t>() <= step,
              metadata, ": parameter '", name, "' has AdamW step ", shown(adamw),
              " (optimizer_step), which a run at extra.step ", step, " cannot have (1 to ", step,
              "): the file was edited; resume from an intact checkpoint or pass --reset-optimizer");
}

// Muon's state of one saved parameter: its momentum. Muon counts no steps (torch.optim.Muon
// neither): there is no step to check against the run's.
void check_muon_state(const nlohmann::json& param, bool optimizer_stepped,
                      const std::string& metadata, const TrainOptions& o) {
  const std::string name = saved_name(param);
  const nlohmann::json moments =
      param.contains("optimizer_moments") ? param["optimizer_moments"] : nlohmann::json();
  const bool has_momentum = moments.is_array() && std::find(moments.begin(), moments.end(),
                                                            "momentum_buffer") != moments.end();
  TORCH_CHECK(has_momentum || !optimizer_stepped || is_frozen(o, name), metadata, ": parameter '",
              name, "' trains but has no Muon state (no momentum_buffer in optimizer_moments): "
              "the checkpoint was saved without it or edited, and Muon's momentum would restart "
              "silently; pass --reset-optimizer to restart both optimizers from these parameters "
              "on purpose, or resume from a complete checkpoint");
}

}  // namespace

int64_t saved_step(const nlohmann::json& extra, const std::string& metadata) {
  return saved_integer(extra, "step", 0, std::numeric_limits<int64_t>::max(), metadata,
                       "the step to continue from")
      .get<int64_t>();
}

uint64_t saved_seed(const nlohmann::json& extra, const std::string& metadata) {
  return saved_integer(extra, "seed", 0, std::numeric_limits<int64_t>::max(), metadata,
                       "the run's --seed")
      .get<uint64_t>();
}

int saved_tp(const nlohmann::json& meta, const std::string& metadata) {
  const nlohmann::json extra = meta.value("extra", nlohmann::json());
  if (!extra.is_object() || !extra.contains("tp")) return 1;  // saved before --tp
  const nlohmann::json world = meta.value("world_size", nlohmann::json());
  const int64_t ranks = world.is_number_integer() && world.get<int64_t>() > 0 ? world.get<int64_t>() : 1;
  const int64_t tp = saved_integer(extra, "tp", 1, static_cast<uint64_t>(ranks), metadata,
                                   "the saved run's --tp").get<int64_t>();
  // The checkpoint's own record of its layout (fsdp::save_sharded's) must agree.
  const nlohmann::json tp_size = meta.value("tp_size", nlohmann::json(1));
  TORCH_CHECK(ranks % tp == 0 && tp_size == nlohmann::json(tp), metadata, ": extra.tp is ", tp,
              " but the checkpoint was saved by ", ranks, " ranks at tensor-parallel size ", shown(tp_size),
              ": the file was edited; resume from an intact checkpoint");
  return static_cast<int>(tp);
}

void check_saved_state(const nlohmann::json& meta, const std::string& folder, const TrainOptions& o) {
  const std::string metadata = folder + "/metadata.json";
  const nlohmann::json extra = meta.value("extra", nlohmann::json());
  const int64_t step = saved_step(extra, metadata);
  saved_seed(extra, metadata);
  saved_tp(meta, metadata);
  const int64_t named = folder_step(folder);
  TORCH_CHECK(named < 0 || named == step, metadata, ": extra.step is ", step, " but its folder is ",
              std::filesystem::path(folder).filename().string(), ": the file was edited or "
              "moved; resume from an intact checkpoint");
  if (o.reset_optimizer || !meta.contains("params") || !meta["params"].is_array()) return;
  // Saved before the optimizers took any step (fp16's scaler skipped them all): no state to restore.
  // Checkpoints of earlier versions do not say, and are taken to have stepped.
  const nlohmann::json stepped = extra.is_object() ? extra.value("optimizer_stepped", nlohmann::json(true))
                                                   : nlohmann::json(true);
  const bool optimizer_stepped = !stepped.is_boolean() || stepped.get<bool>();
  for (const auto& param : meta["params"]) {
    if (!param.is_object()) continue;
    if (saved_optimizer_of(param) == "Muon") {
      check_muon_state(param, optimizer_stepped, metadata, o);
    } else {
      check_adamw_step(param, step, optimizer_stepped, metadata, o);
    }
  }
}

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
    for (const auto& name : meta["optimizers"]) names.push_back(name.is_string() ? name.get<std::string>() : shown(name));
    return names;
  }
  const nlohmann::json name = meta.value("optimizer", nlohmann::json("AdamW"));
  return {name.is_string() ? name.get<std::string>() : shown(name)};
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

void save_checkpoint(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers, const std::string& dir,
                     int64_t next_step, const nlohmann::json& extra, const fsdp::SaveHooks& hooks) {
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
  const nlohmann::json extra = load_checkpoint(model, optimizers, path);
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

void save_checkpoint_if_due(fsdp::Unit<GPT>& model, TrainOptimizers& optimizers,
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
  save_checkpoint(model, optimizers, dir, next_step, describe_run(o, next_step, optimizers.has_state()),
                  hooks);
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
