#include "hf_folder.h"

#include "model_family.h"

#include <fsdp/bounded_json.h>
#include <fsdp/file_checks.h>
#include <fsdp/safetensors.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <utility>

namespace gpt {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kSingleFile = "model.safetensors";
const char* const kIndexFile = "model.safetensors.index.json";

// config.json is ~1 KB; an index holds ~60 bytes per tensor name (a few hundred thousand for the
// largest models). Larger files are not these, and are refused unread.
constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;
constexpr int64_t kMaxIndexBytes = int64_t{64} << 20;

json read_json_file(const fs::path& path, int64_t max_bytes, const std::string& what) {
  const std::vector<char> text = fsdp::read_regular_file(path.string(), max_bytes, what);
  try {
    return fsdp::parse_json_bounded({text.data(), text.size()}, "--init-from-hf " + path.string());
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "--init-from-hf: ", path.string(), " is not valid JSON: ", e.what());
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The files of the folder: model.safetensors, or those that the index's weight_map names (each
// checked to exist and to hold the tensors the index says it does, in HfWeights).
std::vector<std::string> weight_files(const fs::path& dir, json* weight_map) {
  if (fs::exists(dir / kSingleFile)) return {kSingleFile};
  const fs::path index = dir / kIndexFile;
  TORCH_CHECK(fs::exists(index), "--init-from-hf ", dir.string(), " has neither ", kSingleFile,
              " nor ", kIndexFile, " (save the model with save_pretrained(DIR), which writes "
              "safetensors; pytorch_model.bin is not read)");
  const json parsed = read_json_file(index, kMaxIndexBytes, "a Hugging Face model's index");
  TORCH_CHECK(parsed.contains("weight_map") && parsed["weight_map"].is_object(), index.string(),
              " has no \"weight_map\" object of tensor name -> file");
  *weight_map = parsed["weight_map"];
  TORCH_CHECK(!weight_map->empty(), index.string(), ": its \"weight_map\" is empty (it names no "
              "tensor's file), so no weights would load; copy the index that save_pretrained wrote "
              "with its folder");
  std::set<std::string> files;
  for (const auto& [tensor, file] : weight_map->items()) {
    TORCH_CHECK(file.is_string(), index.string(), ": the file of '", tensor, "' is not a string");
    const std::string name = file.get<std::string>();
    // Names, not resolved paths: the Hugging Face cache's snapshot files are links to ../../blobs.
    fsdp::check_relative_name(name, index.string());
    TORCH_CHECK(fs::exists(dir / name),
                index.string(), " names ", name, " for tensor '", tensor, "', but ",
                (dir / name).string(), " does not exist (a shard of the checkpoint is missing: "
                "copy the whole folder)");
    files.insert(name);
  }
  return {files.begin(), files.end()};
}

}  // namespace

json HfConfig::read_json(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  TORCH_CHECK(fs::is_directory(dir), "--init-from-hf ", dir,
              " is not a folder (pass the folder that save_pretrained wrote)");
  TORCH_CHECK(fs::exists(path), "--init-from-hf ", dir, " has no config.json (pass the folder "
              "that save_pretrained wrote)");
  nlohmann::json config = read_json_file(path, kMaxConfigBytes, "a Hugging Face model's config.json");
  TORCH_CHECK(config.is_object(), path.string(), " is not a JSON object");
  return config;
}

namespace {

// A config that ties the head beside files that hold a head of their own, with other values:
// transformers loads that head untied (and warns), which the family does or refuses.
void untie_a_head_of_its_own(const std::string& dir, const std::string& where, GPTConfig& model) {
  if (!model.tied_head) return;
  if (!fs::exists(fs::path(dir) / kSingleFile) && !fs::exists(fs::path(dir) / kIndexFile)) return;
  const ModelFamily& family = family_of(model);
  if (!HfWeights(dir, family.hf_naming(model)).holds_own_head()) return;
  family.untie_head(model, where);
}

// The family whose folders have model_type `type`, or nullptr.
const ModelFamily* hf_family(const std::string& type) {
  for (const ModelFamily* family : model_families()) {
    const std::vector<std::string> types = family->hf_model_types();
    if (std::find(types.begin(), types.end(), type) != types.end()) return family;
  }
  return nullptr;
}

// Every family's model_type, quoted, for the message of a config.json without one:
// "gpt2", "llama", "mistral" or "qwen2".
std::string every_model_type() {
  std::vector<std::string> types;
  for (const ModelFamily* family : model_families()) {
    for (const std::string& type : family->hf_model_types()) types.push_back("\"" + type + "\"");
  }
  std::string text;
  for (size_t i = 0; i < types.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == types.size() ? " or " : ", ") + types[i];
  }
  return text;
}

// What gpt_train loads, family by family: "gpt2" and the Llama family's "llama", ...
std::string loaded_model_types() {
  std::string text;
  for (const ModelFamily* family : model_families()) {
    text += (text.empty() ? "" : " and ") + family->hf_types_text();
  }
  return text;
}

}  // namespace

HfConfig HfConfig::read(const std::string& dir) {
  const std::string where = (fs::path(dir) / "config.json").string();
  HfConfig c;
  c.json = read_json(dir);
  // transformers' AutoConfig picks the class by model_type too: without it, nothing says which model.
  TORCH_CHECK(c.json.contains("model_type"), where, " has no \"model_type\" (transformers needs it "
              "to pick the model's class): add \"model_type\": ", every_model_type());
  const std::string type = hf::text(c.json, "model_type", "", where);
  const ModelFamily* family = hf_family(type);
  TORCH_CHECK(family, where, ": \"model_type\" is \"", type, "\"; gpt_train loads ",
              loaded_model_types());
  c.model = family->hf_config(c.json, where);
  untie_a_head_of_its_own(dir, where, c.model);
  return c;
}

void apply_hf_config(const HfConfig& hf, const std::string& dir, const GivenSizes& given,
                     GPTConfig& model) {
  const std::string where = (fs::path(dir) / "config.json").string();
  const ModelFamily& family = family_of(hf.model);
  const HfSizeKeys keys = family.hf_size_keys();
  auto agree = [&](bool is_given, int64_t value, const char* flag, int64_t wanted, const char* key) {
    TORCH_CHECK(!is_given || value == wanted, flag, " ", value, " contradicts ", where, "'s ", key,
                " ", wanted, " (omit ", flag, ": --init-from-hf takes it from the config)");
  };
  agree(given.layers, model.layers, "--layers", hf.model.layers, keys.layers);
  agree(given.dim, model.dim, "--dim", hf.model.dim, keys.dim);
  agree(given.heads, model.heads, "--heads", hf.model.heads, keys.heads);
  agree(given.vocab, model.vocab_size, "--vocab", hf.model.vocab_size, keys.vocab);
  const auto [limit_key, limit_meaning] = family.hf_context_limit(hf.json, hf.model, where);
  TORCH_CHECK(!given.seq || model.max_seq <= hf.model.context(), "--seq ", model.max_seq,
              " is longer than ", where, "'s ", limit_key, " ", hf.model.context(), " (", limit_meaning,
              "); pass --seq ", hf.model.context(), " or less");
  const int64_t seq = given.seq ? model.max_seq : hf.model.context();
  model = hf.model;
  model.max_seq = seq;
}

// Where one parameter's values lie: a tensor of one of the files, maybe transposed.
struct HfWeights::Source {
  const fsdp::SafetensorsReader* file = nullptr;
  std::string tensor;  // its name in the file
  bool transposed = false;
};

HfWeights::HfWeights(const std::string& dir, HfNaming naming) : dir_(dir), naming_(std::move(naming)) {
  json weight_map = json::object();
  for (const std::string& name : weight_files(dir, &weight_map)) {
    files_.push_back(std::make_unique<fsdp::SafetensorsReader>((fs::path(dir) / name).string()));
  }
  for (const auto& file : files_) {
    for (const auto& entry : file->entries()) {
      if (!weight_map.empty()) {
        const std::string listed = weight_map.value(entry.name, "");
        if (fs::path(file->path()).filename() != listed) {  // the index decides, if copies agree
          if (!listed.empty()) check_second_copy(*file, entry.name, listed);
          continue;
        }
      }
      const std::string name = naming_.model_name(entry.name);
      if (name.empty()) continue;
      if (name == "lm_head.weight" && naming_.tied_head) {
        tied_head_file_ = file->path();
        tied_head_tensor_ = entry.name;
        continue;
      }
      auto source = std::make_unique<Source>();
      source->file = file.get();
      source->tensor = entry.name;
      source->transposed = naming_.transposed(name);
      TORCH_CHECK(sources_.emplace(name, std::move(source)).second, "--init-from-hf ", dir,
                  " holds '", name, "' twice (under two names)");
    }
  }
  for (const auto& [tensor, file] : weight_map.items()) {
    const fs::path path = fs::path(dir) / file.get<std::string>();
    const bool found = std::any_of(files_.begin(), files_.end(), [&](const auto& f) {
      return f->path() == path.string() && f->contains(tensor);
    });
    TORCH_CHECK(found, (fs::path(dir) / kIndexFile).string(), " puts '", tensor, "' in ",
                path.string(), ", which does not hold it (the index and its files disagree)");
  }
}

HfWeights::~HfWeights() = default;

void HfWeights::check_second_copy(const fsdp::SafetensorsReader& file, const std::string& tensor,
                                  const std::string& listed) const {
  const fs::path listed_path = fs::path(dir_) / listed;
  for (const auto& other : files_) {
    if (other->path() != listed_path.string() || !other->contains(tensor)) continue;
    // transformers reads every file of the index and keeps the last file's copy, whatever the
    // index says: copies that differ make a folder whose model depends on that order.
    TORCH_CHECK(hf::same_values(*other, tensor, file, tensor), (fs::path(dir_) / kIndexFile).string(),
                " puts '", tensor, "' in ", listed, ", but ", file.path(), " holds another '", tensor,
                "' with other values (transformers would load the copy of the last file, not the "
                "index's); remove the stale copy");
  }
}

bool HfWeights::holds_own_head() const {
  if (tied_head_file_.empty()) return false;
  fsdp::SafetensorsReader head(tied_head_file_);
  const Source& wte = source("wte.weight");
  return !hf::same_values(head, tied_head_tensor_, *wte.file, wte.tensor);
}

const HfWeights::Source& HfWeights::source(const std::string& name) const {
  auto it = sources_.find(name);
  TORCH_CHECK(it != sources_.end(), "--init-from-hf ", dir_, " has no tensor '", name,
              "' (stored as '", naming_.file_name(name), "'): it is not a ", naming_.kind,
              " of this size");
  return *it->second;
}

void HfWeights::check(const fsdp::ParamShapes& shapes) const {
  std::set<std::string> wanted;
  for (const auto& [name, shape] : shapes) {
    wanted.insert(name);
    const Source& s = source(name);
    const auto& entry = s.file->entry(s.tensor);
    std::vector<int64_t> expected = shape;
    if (s.transposed) std::reverse(expected.begin(), expected.end());
    TORCH_CHECK(entry.shape == expected, s.file->path(), ": tensor '", s.tensor, "' has shape ",
                shape_text(entry.shape), " but the model's ", name, " needs ",
                shape_text(expected), s.transposed ? " (a Conv1D weight, stored [in, out])" : "",
                "; config.json and the weights disagree");
    TORCH_CHECK(at::isFloatingType(entry.dtype), s.file->path(), ": tensor '", s.tensor, "' is ",
                entry.dtype, ", not floating point");
  }
  for (const auto& [name, s] : sources_) {
    TORCH_CHECK(wanted.count(name), s->file->path(), " holds '", s->tensor, "', which gpt_train's ",
                naming_.kind, " does not have (config.json and the weights disagree)");
  }
  if (!tied_head_file_.empty()) {  // a tied head: checked for its shape only, never read
    fsdp::SafetensorsReader head(tied_head_file_);
    const auto& wte = source("wte.weight");
    TORCH_CHECK(head.entry(tied_head_tensor_).shape == wte.file->entry(wte.tensor).shape,
                head.path(), ": ", tied_head_tensor_, "'s shape differs from the embedding's, so "
                "the head is not tied; config.json says it is");
  }
}

at::Tensor HfWeights::read_range(const std::string& name, int64_t begin, int64_t end) const {
  const Source& s = source(name);
  if (!s.transposed) return s.file->read_range(s.tensor, begin, end);
  // The model's [out, in] row r is the file's [in, out] column r: read the columns of the rows
  // that [begin, end) touches, one short positioned read per input row, then transpose them.
  const auto& entry = s.file->entry(s.tensor);
  const int64_t in = entry.shape[0], out = entry.shape[1];
  const int64_t first_row = begin / in, last_row = (end - 1) / in + 1;
  const int64_t rows = last_row - first_row;
  at::Tensor columns = at::empty({in, rows}, at::TensorOptions().dtype(entry.dtype));
  for (int64_t i = 0; i < in; ++i) {
    s.file->read_range_into(s.tensor, i * out + first_row, columns[i]);
  }
  return columns.t().contiguous().view({-1}).narrow(0, begin - first_row * in, end - begin);
}

void load_hf(fsdp::Unit<GPT>& model, const std::string& dir) {
  HfWeights weights(dir, family_of(model->config).hf_naming(model->config));
  weights.check(fsdp::param_shapes(model));
  fsdp::load_params_from(model, [&](const std::string& name, int64_t begin, int64_t end) {
    return weights.read_range(name, begin, end);
  });
}

namespace {

// The shards that an index already in the export's folder names (a sharded model saved there
// before): the export replaces them, so that the folder holds the one model it wrote. Only
// names inside the folder, and never the file the export writes.
std::vector<fs::path> stale_shards(const fs::path& dir) {
  const fs::path index = dir / kIndexFile;
  if (!fs::exists(index)) return {};
  const json parsed = read_json_file(index, kMaxIndexBytes, "a Hugging Face model's index");
  TORCH_CHECK(parsed.contains("weight_map") && parsed["weight_map"].is_object(), "--export-hf: ",
              index.string(), " has no \"weight_map\", so its shards are unknown; remove the old "
              "model's files from ", dir.string(), " or export to an empty folder");
  std::set<fs::path> shards;
  for (const auto& [tensor, file] : parsed["weight_map"].items()) {
    TORCH_CHECK(file.is_string(), index.string(), ": the file of '", tensor, "' is not a string");
    fsdp::check_relative_name(file.get<std::string>(), index.string());
    if (file.get<std::string>() != kSingleFile) shards.insert(dir / file.get<std::string>());
  }
  return {shards.begin(), shards.end()};
}

}  // namespace

void write_hf_folder(const fsdp::NamedTensors& full_params, const GPTConfig& config, const json& base,
               const std::string& dir) {
  fs::create_directories(dir);
  const std::vector<fs::path> stale = stale_shards(dir);
  const ModelFamily& family = family_of(config);
  const HfNaming naming = family.hf_naming(config);
  fsdp::NamedTensors tensors;
  for (const auto& [name, value] : full_params) {
    tensors.emplace_back(naming.file_name(name), naming.transposed(name) ? value.t().contiguous() : value);
  }
  // In name order: the same file whatever order the layout gathered them in (a pipeline's stages).
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  fsdp::save_safetensors((fs::path(dir) / kSingleFile).string(), tensors, {{"format", "pt"}});
  json out = family.hf_config_json(config, base);
  out["dtype"] = "float32";
  out.erase("quantization_config");  // the weights written are fp32, not a quantized model's
  const std::string text = out.dump(2) + "\n";
  fsdp::write_file_atomically((fs::path(dir) / "config.json").string(),
                              std::vector<char>(text.begin(), text.end()));
  // The index first: from_pretrained prefers model.safetensors, and without the index a
  // leftover shard is no model's.
  fs::remove(fs::path(dir) / kIndexFile);
  for (const fs::path& shard : stale) fs::remove(shard);
}

}  // namespace gpt
