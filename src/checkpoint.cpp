// Sharded checkpoints (include/fsdp/checkpoint.h): each rank's pieces of the parameters and of the
// AdamW state to and from its shard file; metadata.json written last by rank 0; the step folders
// and the `latest` pointer of a checkpoint directory.
//
// [Note: checkpoint agreement]
// Every phase that can fail on one rank (a full disk, a missing or corrupt file) is local work
// followed by one exchange of error strings over the world group (throw_if_any_failed), so all
// ranks throw the same error together instead of some waiting forever in the next collective.
// Loading stages everything in fresh tensors first and copies into the model and the optimizer
// only after the exchange said every rank succeeded: a bad checkpoint changes nothing.
#include <fsdp/checkpoint.h>
#include <fsdp/file_checks.h>
#include <fsdp/safetensors.h>

#include "checkpoint_format.h"
#include "crc32.h"
#include "fsdp_state.h"
#include "tensor_boxes.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

namespace fsdp {
namespace detail {

namespace {

namespace fs = std::filesystem;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

constexpr const char* kLatestFile = "latest";
constexpr const char* kMomentKinds[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

// ---- Agreement across ranks: see [Note: checkpoint agreement] ----

std::string message_of(const std::exception& e) {
  if (auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

// Every rank's string, in rank order: one all-reduce of the lengths, one of the bytes if any.
std::vector<std::string> all_gather_strings(ProcessGroup& world, const std::string& mine) {
  const int size = world.size(), rank = world.rank();
  at::Tensor lengths = at::zeros({size}, at::kLong);
  lengths.data_ptr<int64_t>()[rank] = static_cast<int64_t>(mine.size());
  all_reduce_sum(world, lengths);
  const int64_t longest = lengths.max().item<int64_t>();
  std::vector<std::string> all(size);
  if (longest == 0) return all;
  at::Tensor bytes = at::zeros({size, longest}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>() + rank * longest, mine.data(), mine.size());
  all_reduce_sum(world, bytes);
  for (int r = 0; r < size; ++r) {
    const char* row = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>() + r * longest);
    all[r].assign(row, static_cast<size_t>(lengths.data_ptr<int64_t>()[r]));
  }
  return all;
}

// Throws on every rank, naming the first rank that failed, when any rank's `error` is not empty.
void throw_if_any_failed(ProcessGroup& world, const std::string& error, const std::string& what) {
  const auto errors = all_gather_strings(world, error);
  int failed = 0, first = -1;
  for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
    if (errors[r].empty()) continue;
    ++failed;
    if (first < 0) first = r;
  }
  TORCH_CHECK(failed == 0, what, ": rank ", first, ": ", errors[first],
              failed > 1 ? " (and " + std::to_string(failed - 1) + " more ranks failed)" : "");
}

// Runs `local` and returns its error message ("" on success): the local half of an agreement.
template <class F>
std::string try_local(F&& local) {
  try {
    local();
  } catch (const std::exception& e) {
    return message_of(e);
  }
  return "";
}

// ---- This rank's layout ----

/// One parameter's part of this rank's shard.
struct LocalPiece {
  FlatEntry* entry = nullptr;
  at::Tensor data;    // 1-D [end - begin], a view of the flat shard (the optimizer's master copy)
  int64_t begin = 0;  // the same elements as [begin, end) of the flattened parameter
  int64_t end = 0;
};

std::vector<LocalPiece> local_pieces(FsdpState& state) {
  std::vector<LocalPiece> pieces;
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
    TORCH_CHECK(!flat.sharded() || group->sharded_state() == ShardedState::Sharded,
                "unit '", group->name(), "' is unsharded: save and load checkpoints between "
                "steps, not between a forward and its backward");
    for (auto& e : flat.entries()) {
      const auto [begin, end] = flat.local_range(e);
      pieces.push_back(LocalPiece{&e, flat.shard().narrow(0, e.shard_begin, end - begin), begin, end});
    }
  }
  return pieces;
}

// ---- The optimizer's side ----

AdamWParamState* adamw_state(AdamW& optimizer, const at::Tensor& param) {
  auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return nullptr;
  auto* state = dynamic_cast<AdamWParamState*>(it->second.get());
  TORCH_INTERNAL_ASSERT(state, "AdamW holds a state of another optimizer");
  return state;
}

at::Tensor moment(const AdamWParamState& state, const std::string& kind) {
  if (kind == "exp_avg") return state.exp_avg();
  if (kind == "exp_avg_sq") return state.exp_avg_sq();
  return state.max_exp_avg_sq();
}

// The options of the parameter group holding each parameter, by TensorImpl.
std::unordered_map<const void*, const AdamWOptions*> options_by_param(AdamW& optimizer) {
  std::unordered_map<const void*, const AdamWOptions*> options;
  for (auto& group : optimizer.param_groups()) {
    const auto* adamw = static_cast<const AdamWOptions*>(&group.options());
    for (auto& p : group.params()) options[p.unsafeGetTensorImpl()] = adamw;
  }
  return options;
}

// The model's parameters as metadata: names, shapes, dtypes, and this rank's AdamW steps.
std::vector<ParamMeta> describe_model(FsdpState& state, AdamW& optimizer) {
  std::vector<ParamMeta> params;
  for (auto& group : state.groups()) {
    for (auto& e : group->flat().entries()) {
      ParamMeta meta{e.name, e.shape, std::string(c10::toString(e.param.scalar_type())), {}, {}};
      if (const auto* adam = adamw_state(optimizer, e.param)) {
        meta.step = adam->step();
        for (const char* kind : kMomentKinds) {
          if (moment(*adam, kind).defined()) meta.moments.push_back(kind);
        }
      }
      params.push_back(std::move(meta));
    }
  }
  return params;
}

// ---- Saving ----

// Tests kill a save half-way through: FSDP_TEST_SLOW_SAVE=MS sleeps once this rank's shard file is
// written, before the metadata that would complete the folder.
void test_hook_slow_save() {
  if (const char* ms = std::getenv("FSDP_TEST_SLOW_SAVE")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(ms)));
  }
}

// The tensors of one shard file: for each box, the parameter's and its AdamW moments' views.
struct ShardPart {
  NamedTensors tensors;
  nlohmann::json sharding_info = nlohmann::json::object();  // DCP_SHARDING_INFO
  std::vector<PieceMeta> pieces;
};

// torch.distributed.checkpoint's HuggingFaceStorageReader reads a chunk's place in the full tensor
// from the file's __metadata__: {"DCP_SHARDING_INFO": "{KEY: {\"saved_offsets\": [...]}}"}.
void add_box(ShardPart& part, const std::string& key, const at::Tensor& data,
             const std::vector<int64_t>& offsets) {
  part.tensors.emplace_back(key, data);
  part.sharding_info[key] = {{"saved_offsets", offsets}};
}

// Splits this rank's pieces into boxes ([Note: boxes of a flat shard]); part k of the files holds
// the k-th box of every piece. AdamW's step goes, as a 0-d float ("state.NAME.step", as PyTorch's
// AdamW keeps it), with the box that starts the parameter.
std::vector<ShardPart> shard_parts(FsdpState& state, AdamW& optimizer) {
  std::vector<ShardPart> parts;
  for (const auto& piece : local_pieces(state)) {
    const FlatEntry& entry = *piece.entry;
    const auto* adam = adamw_state(optimizer, entry.param);
    const auto boxes = boxes_of_range(entry.shape, piece.begin, piece.end);
    if (parts.size() < boxes.size()) parts.resize(boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k) {
      const TensorBox& box = boxes[k];
      ShardPart& part = parts[k];
      auto view = [&](const at::Tensor& flat) {
        return flat.narrow(0, box.begin - piece.begin, box.end - box.begin).view(box.sizes);
      };
      add_box(part, tensor_key("param", entry.name), view(piece.data), box.offsets);
      part.pieces.push_back(PieceMeta{entry.name, box.begin, box.end, {}});
      if (!adam) continue;
      for (const char* kind : kMomentKinds) {
        const at::Tensor m = moment(*adam, kind);
        if (m.defined()) add_box(part, tensor_key(kind, entry.name), view(m.reshape({-1})), box.offsets);
      }
      if (box.begin == 0) {
        add_box(part, tensor_key("step", entry.name),
                at::scalar_tensor(static_cast<double>(adam->step()), at::kFloat), {});
      }
    }
  }
  return parts;
}

// Writes this rank's shard files; returns their descriptions for metadata.json.
std::vector<FileMeta> write_shard_files(FsdpState& state, AdamW& optimizer, const std::string& folder) {
  auto parts = shard_parts(state, optimizer);
  std::vector<FileMeta> files;
  for (size_t k = 0; k < parts.size(); ++k) {
    ShardPart& part = parts[k];
    FileMeta file;
    file.name = shard_file_name(state.collectives().rank(), static_cast<int>(k),
                                static_cast<int>(parts.size()));
    const WrittenFile written = save_safetensors(
        folder + "/" + file.name, part.tensors,
        {{"DCP_SHARDING_INFO", part.sharding_info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
    file.bytes = written.bytes;
    std::map<std::string, uint32_t> crc_of_key;
    for (size_t t = 0; t < part.tensors.size(); ++t) {
      crc_of_key[part.tensors[t].first] = written.tensor_crc32[t];
    }
    for (auto& piece : part.pieces) {
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"}) {
        auto it = crc_of_key.find(tensor_key(kind, piece.param));
        if (it != crc_of_key.end()) piece.crc32[kind] = it->second;
      }
    }
    file.pieces = std::move(part.pieces);
    files.push_back(std::move(file));
  }
  return files;
}

CheckpointMeta build_metadata(FsdpState& state, AdamW& optimizer,
                              const std::vector<std::string>& descriptions,
                              const nlohmann::json& extra) {
  CheckpointMeta meta;
  meta.world_size = state.world().size();
  meta.shard_group_size = state.collectives().size();
  meta.strategy = to_string(state.options().strategy());
  meta.params = describe_model(state, optimizer);
  for (const auto& description : descriptions) {
    if (description.empty()) continue;  // a replica that wrote nothing
    for (const auto& file : nlohmann::json::parse(description)) {
      meta.files.push_back(parse_file_meta(file));
    }
  }
  meta.extra = extra;
  return meta;
}

// ---- Loading ----

/// What one local piece becomes, staged in fresh tensors until every rank has validated.
struct StagedPiece {
  LocalPiece piece;
  at::Tensor param;                           // 1-D [end - begin]
  std::optional<int64_t> step;                // AdamW step; empty: the saved run had no state
  std::map<std::string, at::Tensor> moments;  // kind -> 1-D [end - begin]
};

/// The shard files this rank reads, by index in metadata.json's list; opening reads the header.
using OpenFiles = std::map<size_t, std::unique_ptr<SafetensorsReader>>;

// One saved tensor of `kind` of a piece, whole, read into `out` (contiguous, its size) and checked
// against its CRC-32 in metadata.json.
void read_checked_into(const SafetensorsReader& file, const PieceMeta& piece,
                       const std::string& kind, const at::Tensor& out) {
  const std::string key = tensor_key(kind, piece.param);
  file.read_range_into(key, 0, out);
  auto expected = piece.crc32.find(kind);
  TORCH_CHECK(expected != piece.crc32.end(), file.path(), ": ", kMetadataFile,
              " has no CRC-32 of tensor '", key, "' (an edited or incomplete metadata file)");
  const uint32_t actual = crc32(out.data_ptr(), out.nbytes());
  TORCH_CHECK(actual == expected->second, file.path(), ": tensor '", key, "' has CRC-32 ", actual,
              " but ", kMetadataFile, " says ", expected->second, ": the file is corrupt");
}

at::Tensor read_checked(const SafetensorsReader& file, const PieceMeta& piece,
                        const std::string& kind) {
  const auto& entry = file.entry(tensor_key(kind, piece.param));
  at::Tensor data = at::empty({entry.numel()}, at::TensorOptions().dtype(entry.dtype));
  read_checked_into(file, piece, kind, data);
  return data;
}

// Opens one shard file and checks it against its description: its size, then every piece's
// tensors (present, the right number of elements and dtype; AdamW's step its saved value).
std::unique_ptr<SafetensorsReader> open_shard_file(const std::string& folder, const FileMeta& file,
                                                   const std::map<std::string, const ParamMeta*>& params) {
  const std::string path = folder + "/" + file.name;
  std::error_code ec;
  TORCH_CHECK(fs::exists(fs::symlink_status(path, ec)), "cannot open ", path,
              ": no such file (a shard file is missing: was the checkpoint copied completely?)");
  auto reader = std::make_unique<SafetensorsReader>(path);  // refuses a FIFO or a device unread
  TORCH_CHECK(reader->file_bytes() == file.bytes, path, " is ", reader->file_bytes(), " bytes but ",
              kMetadataFile, " says ", file.bytes, ": the file is truncated or was replaced");
  for (const auto& piece : file.pieces) {
    const ParamMeta& param = *params.at(piece.param);
    std::vector<std::string> kinds{"param"};
    if (param.step) kinds.insert(kinds.end(), param.moments.begin(), param.moments.end());
    for (const auto& kind : kinds) {
      const auto& entry = reader->entry(tensor_key(kind, piece.param));
      TORCH_CHECK(entry.numel() == piece.end - piece.begin &&
                      std::string(c10::toString(entry.dtype)) == param.dtype,
                  path, ": tensor '", entry.name, "' is ", entry.dtype, " of ", entry.numel(),
                  " elements but ", kMetadataFile, " says ", param.dtype, " of ",
                  piece.end - piece.begin);
    }
    if (piece.crc32.count("step")) {
      const double step = read_checked(*reader, piece, "step").item<double>();
      TORCH_CHECK(param.step && step == static_cast<double>(*param.step), path, ": tensor '",
                  tensor_key("step", piece.param), "' disagrees with ", kMetadataFile);
    }
  }
  return reader;
}

/// Where each saved piece lives: by parameter, (file index, piece).
using PieceIndex = std::map<std::string, std::vector<std::pair<size_t, const PieceMeta*>>>;

PieceIndex index_pieces(const CheckpointMeta& meta) {
  PieceIndex index;
  for (size_t f = 0; f < meta.files.size(); ++f) {
    for (const auto& piece : meta.files[f].pieces) index[piece.param].emplace_back(f, &piece);
  }
  return index;
}

// `out` (1-D [end - begin], elements [begin, end) of the flattened parameter) <- the saved
// pieces that overlap it (check_matches_model proved they cover it exactly once).
void assemble(const at::Tensor& out, int64_t begin, int64_t end, const std::string& kind,
              const std::string& param, const PieceIndex& index, const OpenFiles& files) {
  if (begin == end) return;
  for (const auto& [f, piece] : index.at(param)) {
    const int64_t lo = std::max(begin, piece->begin), hi = std::min(end, piece->end);
    if (lo >= hi) continue;
    if (lo == piece->begin && hi == piece->end) {  // a whole saved box (same layout): no copy
      read_checked_into(*files.at(f), *piece, kind, out.narrow(0, lo - begin, hi - lo));
      continue;
    }
    const at::Tensor saved = read_checked(*files.at(f), *piece, kind);
    out.narrow(0, lo - begin, hi - lo).copy_(saved.narrow(0, lo - piece->begin, hi - lo));
  }
}

// The AdamW tensors this rank's optimizer needs for `param` (amsgrad adds max_exp_avg_sq).
std::vector<std::string> moments_needed(const AdamWOptions& options) {
  std::vector<std::string> kinds{"exp_avg", "exp_avg_sq"};
  if (options.amsgrad()) kinds.push_back("max_exp_avg_sq");
  return kinds;
}

std::vector<StagedPiece> stage(FsdpState& state, AdamW& optimizer, const CheckpointMeta& meta,
                               const std::string& folder) {
  std::map<std::string, const ParamMeta*> params;
  for (const auto& p : meta.params) params[p.name] = &p;
  const PieceIndex index = index_pieces(meta);
  const auto options = options_by_param(optimizer);
  const std::vector<LocalPiece> pieces = local_pieces(state);

  OpenFiles files;  // only those holding elements of this rank's pieces
  for (const auto& piece : pieces) {
    if (piece.begin == piece.end) continue;
    for (const auto& [f, saved] : index.at(piece.entry->name)) {
      if (saved->begin < piece.end && piece.begin < saved->end && !files.count(f)) {
        files.emplace(f, open_shard_file(folder, meta.files[f], params));
      }
    }
  }
  std::vector<StagedPiece> staged;
  for (const auto& piece : pieces) {
    const std::string& name = piece.entry->name;
    const ParamMeta& saved = *params.at(name);
    StagedPiece s{piece, at::empty({piece.end - piece.begin}, piece.data.options()), saved.step, {}};
    assemble(s.param, piece.begin, piece.end, "param", name, index, files);
    if (saved.step) {
      auto it = options.find(piece.entry->param.unsafeGetTensorImpl());
      TORCH_CHECK(it != options.end(), folder, " holds AdamW state for '", name,
                  "' but the optimizer does not hold that parameter: build it over "
                  "model->parameters()");
      for (const auto& kind : moments_needed(*it->second)) {
        TORCH_CHECK(std::find(saved.moments.begin(), saved.moments.end(), kind) !=
                        saved.moments.end(),
                    folder, " has no '", kind, "' for '", name,
                    "': it was saved by an AdamW without amsgrad");
        s.moments[kind] = at::empty({piece.end - piece.begin}, piece.data.options());
        assemble(s.moments[kind], piece.begin, piece.end, kind, name, index, files);
      }
    }
    staged.push_back(std::move(s));
  }
  return staged;
}

// Copies the staged pieces into the shards and replaces the optimizer's state. Cannot fail.
void apply(AdamW& optimizer, std::vector<StagedPiece>& staged) {
  torch::NoGradGuard no_grad;
  for (auto& s : staged) {
    s.piece.data.copy_(s.param);
    const at::Tensor& param = s.piece.entry->param;
    void* key = param.unsafeGetTensorImpl();
    if (!s.step) {
      optimizer.state().erase(key);
      continue;
    }
    auto adam = std::make_unique<AdamWParamState>();
    adam->step(*s.step);
    adam->exp_avg(s.moments.at("exp_avg").view(param.sizes()));
    adam->exp_avg_sq(s.moments.at("exp_avg_sq").view(param.sizes()));
    if (s.moments.count("max_exp_avg_sq")) {
      adam->max_exp_avg_sq(s.moments.at("max_exp_avg_sq").view(param.sizes()));
    }
    optimizer.state()[key] = std::move(adam);
  }
}

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

void save_sharded(FsdpState& state, AdamW& optimizer, const std::string& folder,
                  const nlohmann::json& extra) {
  ProcessGroup& world = state.world();
  const std::string metadata = folder + "/" + kMetadataFile;
  // An old metadata.json would make a half-rewritten folder look complete.
  std::string error = try_local([&] {
    if (world.rank() != 0) return;
    fs::create_directories(folder);
    fs::remove(metadata);
  });
  throw_if_any_failed(world, error, "save_sharded: cannot prepare " + folder);

  // One shard file per shard of the first replica (the others hold the same values).
  auto* replicas = state.replicate_collectives();
  const bool writer = replicas == nullptr || replicas->rank() == 0;
  std::string description;
  error = try_local([&] {
    if (!writer) return;
    nlohmann::json files = nlohmann::json::array();
    for (const auto& file : write_shard_files(state, optimizer, folder)) files.push_back(to_json(file));
    description = files.dump();
    test_hook_slow_save();
  });
  throw_if_any_failed(world, error, "save_sharded: cannot write " + folder);

  const auto descriptions = all_gather_strings(world, description);
  error = try_local([&] {
    if (world.rank() != 0) return;
    const CheckpointMeta meta = build_metadata(state, optimizer, descriptions, extra);
    check_matches_model(meta, describe_model(state, optimizer), metadata);  // a complete layout
    const std::string text = to_json(meta).dump(1);
    write_file_atomically(metadata, std::vector<char>(text.begin(), text.end()));
  });
  throw_if_any_failed(world, error, "save_sharded: cannot complete " + folder);
}

nlohmann::json load_sharded(FsdpState& state, AdamW& optimizer, const std::string& folder) {
  ProcessGroup& world = state.world();
  const std::string metadata = folder + "/" + kMetadataFile;
  CheckpointMeta meta;
  std::vector<StagedPiece> staged;
  uint32_t metadata_crc = 0;
  std::string error = try_local([&] {
    TORCH_CHECK(fs::exists(metadata), metadata, " does not exist: ", folder,
                " is not a complete checkpoint (a save interrupted before it finished?)");
    const std::vector<char> text =
        read_regular_file(metadata, kMaxMetadataBytes, "a checkpoint's metadata.json");
    metadata_crc = crc32(text.data(), text.size());
    meta = parse_metadata(std::string(text.begin(), text.end()), metadata);
    for (const auto& file : meta.files) check_name_inside(folder, file.name, metadata);
    check_matches_model(meta, describe_model(state, optimizer), metadata);
    staged = stage(state, optimizer, meta, folder);
  });
  throw_if_any_failed(world, error, "load_sharded: cannot load " + folder);

  // Ranks that read different folders (no shared file system?) must not mix checkpoints.
  at::Tensor crc = at::full({1}, static_cast<int64_t>(metadata_crc), at::kLong);
  broadcast(world, crc, /*root=*/0);
  error = crc.item<int64_t>() == static_cast<int64_t>(metadata_crc)
              ? ""
              : metadata + " differs from rank 0's: every rank must read the same checkpoint";
  throw_if_any_failed(world, error, "load_sharded: cannot load " + folder);

  apply(optimizer, staged);
  return meta.extra;
}

std::string save_checkpoint(FsdpState& state, AdamW& optimizer, const std::string& dir,
                            int64_t step, const nlohmann::json& extra, int keep_last) {
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
  save_sharded(state, optimizer, folder, extra);
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

NamedTensors gather_full_optimizer_state(FsdpState& state, AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  bool amsgrad = false;  // the same on every rank, so every rank runs the same collectives
  for (auto& group : optimizer.param_groups()) {
    amsgrad = amsgrad || static_cast<const AdamWOptions&>(group.options()).amsgrad();
  }
  NamedTensors out;
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
    for (const char* kind : kMomentKinds) {
      if (std::string(kind) == "max_exp_avg_sq" && !amsgrad) continue;
      // On the collectives' device (a GPU's, also when the shards are offloaded to the host).
      const auto options = flat.shard().options().device(state.compute_device()).pinned_memory(false);
      at::Tensor shard = at::zeros({flat.shard_numel()}, options);
      for (auto& e : flat.entries()) {
        const auto* adam = adamw_state(optimizer, e.param);
        if (adam && moment(*adam, kind).defined() && e.shard_end > e.shard_begin) {
          shard.narrow(0, e.shard_begin, e.shard_end - e.shard_begin)
              .copy_(moment(*adam, kind).reshape({-1}));
        }
      }
      at::Tensor full = at::empty({flat.padded_numel()}, shard.options());
      state.collectives().all_gather(full, shard);
      for (auto& e : flat.entries()) {
        const auto* adam = adamw_state(optimizer, e.param);
        if (!adam || !moment(*adam, kind).defined()) continue;
        out.emplace_back(tensor_key(kind, e.name),
                         full.narrow(0, e.offset, e.numel).view(e.shape).clone());
      }
    }
    for (auto& e : flat.entries()) {
      if (const auto* adam = adamw_state(optimizer, e.param)) {
        out.emplace_back(tensor_key("step", e.name), at::scalar_tensor(adam->step(), at::kLong));
      }
    }
  }
  return out;
}

}  // namespace detail

std::string latest_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string published = detail::read_latest_name(dir);
  if (!published.empty()) return dir + "/" + published;
  // No pointer (deleted, or never published): the newest folder that has its metadata.
  std::error_code ec;
  int64_t newest = -1;
  std::string found;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const int64_t step = detail::step_of(item.path().filename().string());
    if (step > newest && fs::exists(item.path() / kMetadataFile)) {
      newest = step;
      found = item.path().string();
    }
  }
  return found;
}

}  // namespace fsdp
