// The step folders of a checkpoint directory (include/fsdp/checkpoint.h): one folder per saved
// step, the `latest` pointer published once a folder is complete, the pruning of older folders.
#include <fsdp/bounded_json.h>
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>
#include <fsdp/printable.h>

#include "io/checkpoint_agreement.h"
#include "io/checkpoint_format.h"
#include "io/pending_save.h"
#include "io/step_folders.h"
#include "core/sharded_view.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

namespace fsdp {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLatestFile = "latest";
constexpr const char* kRunLockFile = "run.lock";  // fsdp::RunLock's file ([Note: run lock])

std::string step_folder_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

// Any number of up to 18 digits fits int64; save_checkpoint writes 8 or more.
constexpr size_t kMaxStepDigits = 18;

// The step of a folder named step-N (N of 1 to kMaxStepDigits digits), or -1.
int64_t step_of(const std::string& name) {
  const size_t digits = name.size() - std::min<size_t>(name.size(), 5);
  if (digits == 0 || digits > kMaxStepDigits || name.compare(0, 5, "step-") != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// `latest` holds a step folder's name: ~15 bytes. A larger file is no pointer.
constexpr int64_t kMaxLatestBytes = 4096;

// The step folder that `dir`/latest names, or "" when there is no `latest`. A `latest` that is not
// exactly what save_checkpoint writes (a regular file: the name of a step folder inside `dir`,
// then a newline) throws, naming the file and the rule: resuming silently from another step
// than the published one (or from none) would continue the run from the wrong state.
std::string read_latest_name(const std::string& dir) {
  const std::string path = dir + "/" + kLatestFile;
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (!fs::exists(status)) return "";
  TORCH_CHECK(!fs::is_symlink(status), path, " is a symbolic link: `latest` must be the regular "
              "file that save_checkpoint writes (a link may name another run's pointer); remove "
              "it to load the newest complete step folder, or write that folder's name into it");
  const std::vector<char> bytes = read_regular_file(path, kMaxLatestBytes,
                                                    "a checkpoint directory's `latest` pointer");
  std::string name(bytes.begin(), bytes.end());
  if (!name.empty() && name.back() == '\n') name.pop_back();
  TORCH_CHECK(step_of(name) >= 0, path, " holds '", printable(name, 64), "', not the name of a step "
              "folder: `latest` must hold step-N (N of 1 to ", kMaxStepDigits, " digits) and a "
              "newline, as save_checkpoint writes it; write the name of the step folder to load "
              "into it, or remove it to load the newest complete one");
  check_name_inside(dir, name, path);
  return name;
}

// Whether `item` is what save_checkpoint or RunLock leave in a checkpoint directory: the regular
// file `latest` or `run.lock`, or a folder named as save_checkpoint names them (8 digits or more:
// a "step-1" folder is no mark of a checkpoint directory).
bool is_checkpoint_dir_entry(const fs::directory_entry& item) {
  std::error_code ec;
  const std::string name = item.path().filename().string();
  if (name == kLatestFile || name == kRunLockFile) return item.is_regular_file(ec) && !item.is_symlink(ec);
  return name.size() >= 13 && step_of(name) >= 0 && item.is_directory(ec);
}

// What makes `folder` a checkpoint directory (the first such entry, a folder's with a "/"), or
// "". `skip`: an entry not to count (the way down to the folder being checked).
std::string checkpoint_dir_mark(const fs::path& folder, const std::string& skip = "") {
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(folder, ec)) {
    const std::string name = item.path().filename().string();
    if (name != skip && is_checkpoint_dir_entry(item)) return name + (item.is_directory(ec) ? "/" : "");
  }
  return "";
}

// What in the step folder `folder` no save writes (a folder, a link, a run lock, a `latest`: the
// checkpoint directory of another run placed there), or "" when it holds only a save's files.
std::string foreign_entry(const fs::path& folder) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(folder, ec))) return folder.filename().string();
  for (const auto& item : fs::directory_iterator(folder, ec)) {
    const std::string name = item.path().filename().string();
    if (!item.is_regular_file(ec) || item.is_symlink(ec) || name == kRunLockFile ||
        name == kLatestFile) {
      return name;
    }
  }
  return "";
}

// Removes step folders older than the newest `keep_last` ones up to `published`: only those that
// hold nothing but what a save writes, never another run's folder placed inside one. Best effort:
// the checkpoint is already published, so a failure only warns.
void prune(const std::string& dir, int keep_last, const std::string& published) {
  if (keep_last <= 0) return;
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of(item.path().filename().string());
    if (step >= 0 && step < step_of(published)) older.emplace_back(step, item.path());
  }
  std::sort(older.rbegin(), older.rend());
  for (size_t i = static_cast<size_t>(keep_last - 1); i < older.size(); ++i) {
    const fs::path& folder = older[i].second;
    if (const std::string foreign = foreign_entry(folder); !foreign.empty()) {
      std::cerr << "save_checkpoint: warning: not removing the old step folder "
                << printable(folder.string()) << ": it holds " << printable(foreign)
                << ", which no save writes (another run's checkpoint folder?); move it out, or "
                   "remove the folder by hand" << std::endl;
      continue;
    }
    fs::remove_all(folder, ec);
    if (ec) std::cerr << "save_checkpoint: warning: cannot remove " << printable(folder.string())
                      << ": " << ec.message() << std::endl;
  }
}

// `dir` absolute, its links resolved as far as it exists, without a trailing "/".
fs::path resolved_folder(const std::string& dir) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) out = fs::absolute(dir).lexically_normal();
  while (out.has_relative_path() && !out.has_filename()) out = out.parent_path();
  return out;
}

// The nearest folder above `dir` that is a checkpoint directory, with its mark; {} when none is.
std::pair<fs::path, std::string> enclosing_checkpoint_dir(const std::string& dir) {
  fs::path below = resolved_folder(dir);
  while (below.has_relative_path()) {
    const fs::path above = below.parent_path();
    if (std::string mark = checkpoint_dir_mark(above, below.filename().string()); !mark.empty()) {
      return {above, mark};
    }
    below = above;
  }
  return {};
}

// A checkpoint directory below `dir`, looked for a few levels deep (a run's own step folders hold
// only files: any folder below that is a checkpoint directory is another run's); {} when none is.
constexpr int kNestedSearchDepth = 3;
constexpr int kNestedSearchEntries = 100000;  // bounds the walk of a large folder

std::pair<fs::path, std::string> nested_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (int entries = 0; !ec && it != fs::recursive_directory_iterator() &&
                        entries < kNestedSearchEntries;
       it.increment(ec), ++entries) {
    if (it->is_symlink(ec) || !it->is_directory(ec)) continue;
    if (std::string mark = checkpoint_dir_mark(it->path()); !mark.empty()) return {it->path(), mark};
    if (it.depth() + 1 >= kNestedSearchDepth) it.disable_recursion_pending();
  }
  return {};
}

}  // namespace

std::string save_checkpoint(const ShardedModel& model, torch::optim::Optimizer& optimizer,
                            const std::string& dir, int64_t step, const nlohmann::json& extra,
                            int keep_last, const SaveHooks& hooks) {
  return save_checkpoint(model, std::vector<torch::optim::Optimizer*>{&optimizer}, dir, step, extra, keep_last,
                         hooks);
}

namespace detail {

// `extra` with the step save_checkpoint was given, so that load_sharded returns it (the caller's
// own "step", when it passes one, must be that step: a checkpoint stating two steps would resume
// from one of them at random).
nlohmann::json extra_with_step(const nlohmann::json& extra, int64_t step) {
  TORCH_CHECK(extra.is_object() || extra.is_null(), "save_checkpoint: extra must be a JSON object "
              "(it gets the step), not ", json_excerpt(extra), "; put the value under a key of "
              "one: {{\"mine\", value}}");
  nlohmann::json out = extra.is_null() ? nlohmann::json::object() : extra;
  if (out.contains("step")) {
    TORCH_CHECK(out["step"] == nlohmann::json(step), "save_checkpoint: extra.step is ",
                json_excerpt(out["step"]), " but the step saved is ", step, ": leave \"step\" "
                "out of extra (save_checkpoint records it) or pass the same step");
  }
  out["step"] = step;
  return out;
}

std::string unpublished_step_folder(const AgreementGroups& world, const std::string& dir, int64_t step) {
  TORCH_CHECK(step >= 0, "save_checkpoint: step must be >= 0, got ", step);
  const std::string name = step_folder_name(step);
  const std::string error = try_local([&] {
    if (world.rank() != 0) return;
    TORCH_CHECK(read_latest_name(dir) != name, dir, "/", name, " is the published checkpoint; "
                "saving step ", step, " again would overwrite it in place (save another step)");
  });
  throw_if_any_failed(world, error, "save_checkpoint");
  return name;
}

void publish_step_folder(const AgreementGroups& world, const std::string& dir, const std::string& name,
                         int keep_last) {
  // Publishing: `latest` names the new folder only now that it is complete.
  const std::string error = try_local([&] {
    if (world.rank() != 0) return;
    const std::string text = name + "\n";
    write_file_atomically(dir + "/" + kLatestFile, std::vector<char>(text.begin(), text.end()));
    prune(dir, keep_last, name);
  });
  throw_if_any_failed(world, error, "save_checkpoint: cannot publish " + dir + "/" + name);
}

}  // namespace detail

std::string save_checkpoint(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                            const std::string& dir, int64_t step, const nlohmann::json& extra,
                            int keep_last, const SaveHooks& hooks) {
  using namespace detail;
  wait_for_pending_save();  // an asynchronous save still writing publishes first
  const nlohmann::json extra_and_step = extra_with_step(extra, step);
  const AgreementGroups world = agreement_groups(ShardedView(model));  // with the tp ranks, if any
  const std::string name = unpublished_step_folder(world, dir, step);
  save_sharded(model, optimizers, dir + "/" + name, extra_and_step, hooks);
  publish_step_folder(world, dir, name, keep_last);
  return dir + "/" + name;
}

void check_checkpoint_dir_alone(const std::string& dir) {
  const auto [outer, outer_mark] = enclosing_checkpoint_dir(dir);
  TORCH_CHECK(outer.empty(), printable(dir), " lies inside ", printable(outer.string()),
              ", the checkpoint folder of another run (it holds ", printable(outer_mark),
              "): that run's pruning and checks would take this run's files for its own, and "
              "delete them; pass a folder outside it");
  const auto [inner, inner_mark] = nested_checkpoint_dir(dir);
  TORCH_CHECK(inner.empty(), printable(dir), " holds ", printable(inner.string()),
              ", the checkpoint folder of another run (it holds ", printable(inner_mark),
              "): this run's pruning would delete it; move it out, or pass another folder");
}

std::string latest_checkpoint(const std::string& dir) {
  const std::string published = read_latest_name(dir);
  if (!published.empty()) return dir + "/" + published;
  // No pointer (deleted, or never published): the newest folder that has its metadata.
  std::error_code ec;
  int64_t newest = -1;
  std::string found;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of(item.path().filename().string());
    if (step > newest && fs::exists(item.path() / kMetadataFile)) {
      newest = step;
      found = item.path().string();
    }
  }
  return found;
}

}  // namespace fsdp
