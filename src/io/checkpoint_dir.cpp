// The step folders of a checkpoint directory (include/fsdp/checkpoint.h): one folder per saved
// step, the `latest` pointer published once a folder is complete, the pruning of older folders.
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>

#include "io/checkpoint_agreement.h"
#include "io/checkpoint_format.h"
#include "core/fsdp_state.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

namespace fsdp {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLatestFile = "latest";

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

// `text` as a message can show it: at most 64 bytes, control bytes escaped.
std::string visible(const std::string& text) {
  std::string out;
  for (unsigned char c : text.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    }
  }
  return text.size() > 64 ? out + "..." : out;
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
  TORCH_CHECK(step_of(name) >= 0, path, " holds '", visible(name), "', not the name of a step "
              "folder: `latest` must hold step-N (N of 1 to ", kMaxStepDigits, " digits) and a "
              "newline, as save_checkpoint writes it; write the name of the step folder to load "
              "into it, or remove it to load the newest complete one");
  check_name_inside(dir, name, path);
  return name;
}

// Removes step folders older than the newest `keep_last` ones up to `published`. Best effort:
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
    fs::remove_all(older[i].second, ec);
    if (ec) std::cerr << "save_checkpoint: warning: cannot remove " << older[i].second << ": "
                      << ec.message() << std::endl;
  }
}

}  // namespace

namespace detail {

std::string save_checkpoint(FsdpState& state, torch::optim::AdamW& optimizer,
                            const std::string& dir, int64_t step, const nlohmann::json& extra,
                            int keep_last, const SaveHooks& hooks) {
  TORCH_CHECK(step >= 0, "save_checkpoint: step must be >= 0, got ", step);
  ProcessGroup& world = state.world();
  const std::string name = step_folder_name(step);
  std::string error = try_local([&] {
    if (world.rank() != 0) return;
    TORCH_CHECK(read_latest_name(dir) != name, dir, "/", name, " is the published checkpoint; "
                "saving step ", step, " again would overwrite it in place (save another step)");
  });
  throw_if_any_failed(world, error, "save_checkpoint");

  const std::string folder = dir + "/" + name;
  save_sharded(state, optimizer, folder, extra, hooks);
  // Publishing: `latest` names the new folder only now that it is complete.
  error = try_local([&] {
    if (world.rank() != 0) return;
    const std::string text = name + "\n";
    write_file_atomically(dir + "/" + kLatestFile, std::vector<char>(text.begin(), text.end()));
    prune(dir, keep_last, name);
  });
  throw_if_any_failed(world, error, "save_checkpoint: cannot publish " + folder);
  return folder;
}

}  // namespace detail

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
