// gpt_train's paths, checked before any work ([run_paths.h]).
#include "run_paths.h"

#include <fsdp/file_checks.h>
#include <fsdp/printable.h>
#include <fsdp/run_lock.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
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

}  // namespace gpt
