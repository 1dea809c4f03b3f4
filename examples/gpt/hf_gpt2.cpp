#include "hf_gpt2.h"

#include "gpt.h"

#include <fsdp/bounded_json.h>
#include <fsdp/file_checks.h>
#include <fsdp/safetensors.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

namespace gpt {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kSingleFile = "model.safetensors";
const char* const kIndexFile = "model.safetensors.index.json";
const char* const kPrefix = "transformer.";

// config.json is ~1 KB; an index holds ~60 bytes per tensor name (a few hundred thousand for the
// largest models). Larger files are not these, and are refused unread.
constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;
constexpr int64_t kMaxIndexBytes = int64_t{64} << 20;

json read_json(const fs::path& path, int64_t max_bytes, const std::string& what) {
  const std::vector<char> text = fsdp::read_regular_file(path.string(), max_bytes, what);
  try {
    return fsdp::parse_json_bounded({text.data(), text.size()}, "--init-from-hf " + path.string());
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "--init-from-hf: ", path.string(), " is not valid JSON: ", e.what());
  }
}

// A size of config.json, at most `max` (`bound` says whose: training and planning refuse the same).
int64_t positive_size(const json& config, const std::string& key, const std::string& path,
                      int64_t max, const char* bound) {
  TORCH_CHECK(config.contains(key), path, " has no \"", key,
              "\": a GPT-2 config.json (transformers' GPT2Config) states every size");
  const json& value = config[key];
  TORCH_CHECK((value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() >= 1) ||
                  (value.is_number_unsigned() && value.get<uint64_t>() >= 1),
              path, ": \"", key, "\" must be a positive whole number, got ",
              fsdp::json_excerpt(value));
  TORCH_CHECK(value.is_number_unsigned() ? value.get<uint64_t>() <= static_cast<uint64_t>(max)
                                         : value.get<int64_t>() <= max,
              path, ": \"", key, "\" is ", fsdp::json_excerpt(value), ", more than the ", max,
              " gpt_train builds (", bound, "); this is not a model it can train or plan");
  return value.get<int64_t>();
}

// A key that this GPT cannot represent otherwise: absent (transformers' default) or `expected`.
void require(const json& config, const std::string& key, const json& expected,
             const std::string& path, const std::string& why) {
  if (!config.contains(key) || config[key].is_null() || config[key] == expected) return;
  TORCH_CHECK(false, path, ": \"", key, "\" is ", fsdp::json_excerpt(config[key]), ", but gpt_train's GPT ",
              why, "; only ", expected.dump(), " can be loaded");
}

// GPT-2's Conv1D weights, stored [in, out]: transposed to and from Linear's [out, in].
bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                             ".mlp.c_proj.weight"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Tensors of a GPT-2 file that are not parameters of the model: the causal-mask buffers.
bool is_mask_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

std::string model_name(const std::string& file_name) {
  return file_name.rfind(kPrefix, 0) == 0 ? file_name.substr(std::string(kPrefix).size())
                                           : file_name;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The files of the folder: model.safetensors, or those that the index's weight_map names (each
// checked to exist and to hold the tensors the index says it does, in HfGpt2Weights).
std::vector<std::string> weight_files(const fs::path& dir, json* weight_map) {
  if (fs::exists(dir / kSingleFile)) return {kSingleFile};
  const fs::path index = dir / kIndexFile;
  TORCH_CHECK(fs::exists(index), "--init-from-hf ", dir.string(), " has neither ", kSingleFile,
              " nor ", kIndexFile, " (save the model with save_pretrained(DIR), which writes "
              "safetensors; pytorch_model.bin is not read)");
  const json parsed = read_json(index, kMaxIndexBytes, "a Hugging Face model's index");
  TORCH_CHECK(parsed.contains("weight_map") && parsed["weight_map"].is_object(), index.string(),
              " has no \"weight_map\" object of tensor name -> file");
  *weight_map = parsed["weight_map"];
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

HfGpt2Config HfGpt2Config::read(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  TORCH_CHECK(fs::is_directory(dir), "--init-from-hf ", dir,
              " is not a folder (pass the folder that save_pretrained wrote)");
  TORCH_CHECK(fs::exists(path), "--init-from-hf ", dir, " has no config.json (pass the folder "
              "that save_pretrained wrote)");
  const std::string where = path.string();
  HfGpt2Config c;
  c.json = read_json(path, kMaxConfigBytes, "a Hugging Face model's config.json");
  TORCH_CHECK(c.json.is_object(), where, " is not a JSON object");
  require(c.json, "model_type", "gpt2", where, "is GPT-2");
  c.vocab_size = positive_size(c.json, "vocab_size", where, kMaxVocab, "the bound of --vocab");
  c.n_positions = positive_size(c.json, "n_positions", where, kMaxPositions,
                                "a context no model has; --seq's bound is the run's");
  c.n_layer = positive_size(c.json, "n_layer", where, kMaxLayers, "the bound of --layers");
  c.n_embd = positive_size(c.json, "n_embd", where, kMaxDim, "the bound of --dim");
  c.n_head = positive_size(c.json, "n_head", where, kMaxHeads, "the bound of --heads");
  TORCH_CHECK(c.n_embd % c.n_head == 0, where, ": n_embd ", c.n_embd,
              " is not a multiple of n_head ", c.n_head);
  const nlohmann::json activation = c.json.value("activation_function", nlohmann::json("gelu_new"));
  TORCH_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", where,
              ": \"activation_function\" is ", fsdp::json_excerpt(activation), ", but gpt_train's GPT uses "
              "GPT-2's tanh GELU; only \"gelu_new\" (or \"gelu_pytorch_tanh\") can be loaded");
  if (c.json.contains("layer_norm_epsilon")) {
    const nlohmann::json& eps = c.json["layer_norm_epsilon"];
    TORCH_CHECK(eps.is_number() && std::abs(eps.get<double>() - 1e-5) <= 1e-12, where,
                ": \"layer_norm_epsilon\" is ", fsdp::json_excerpt(eps), ", but gpt_train's GPT uses "
                "LayerNorm's 1e-5; only 1e-5 can be loaded");
  }
  require(c.json, "tie_word_embeddings", true, where, "ties its output head to wte");
  require(c.json, "n_inner", 4 * c.n_embd, where, "has an MLP of 4·n_embd");
  require(c.json, "scale_attn_weights", true, where, "scales attention by 1/sqrt(head_dim)");
  require(c.json, "scale_attn_by_inverse_layer_idx", false, where,
          "does not scale attention by layer");
  require(c.json, "add_cross_attention", false, where, "has no cross-attention");
  return c;
}

void apply_hf_config(const HfGpt2Config& hf, const std::string& dir, const GivenSizes& given,
                     GPTConfig& model) {
  const std::string where = (fs::path(dir) / "config.json").string();
  auto agree = [&](bool is_given, int64_t value, const char* flag, int64_t wanted,
                   const char* key) {
    TORCH_CHECK(!is_given || value == wanted, flag, " ", value, " contradicts ", where, "'s ", key,
                " ", wanted, " (omit ", flag, ": --init-from-hf takes it from the config)");
  };
  agree(given.layers, model.layers, "--layers", hf.n_layer, "n_layer");
  agree(given.dim, model.dim, "--dim", hf.n_embd, "n_embd");
  agree(given.heads, model.heads, "--heads", hf.n_head, "n_head");
  agree(given.vocab, model.vocab_size, "--vocab", hf.vocab_size, "vocab_size");
  TORCH_CHECK(!given.seq || model.max_seq <= hf.n_positions, "--seq ", model.max_seq,
              " is longer than ", where, "'s n_positions ", hf.n_positions,
              " (the model's context); pass --seq ", hf.n_positions, " or less");
  model.layers = hf.n_layer;
  model.dim = hf.n_embd;
  model.heads = hf.n_head;
  model.vocab_size = hf.vocab_size;
  model.positions = hf.n_positions;
  if (!given.seq) model.max_seq = hf.n_positions;
}

// Where one parameter's values lie: a tensor of one of the files, maybe transposed.
struct HfGpt2Weights::Source {
  const fsdp::SafetensorsReader* file = nullptr;
  std::string tensor;  // its name in the file
  bool transposed = false;
};

HfGpt2Weights::HfGpt2Weights(const std::string& dir) : dir_(dir) {
  json weight_map = json::object();
  for (const std::string& name : weight_files(dir, &weight_map)) {
    files_.push_back(std::make_unique<fsdp::SafetensorsReader>((fs::path(dir) / name).string()));
  }
  for (const auto& file : files_) {
    for (const auto& entry : file->entries()) {
      if (!weight_map.empty()) {
        const std::string listed = weight_map.value(entry.name, "");
        if (fs::path(file->path()).filename() != listed) continue;  // the index decides
      }
      if (is_mask_buffer(entry.name)) continue;
      const std::string name = model_name(entry.name);
      if (name == "lm_head.weight") {
        skipped_[name] = file->path();
        continue;
      }
      auto source = std::make_unique<Source>();
      source->file = file.get();
      source->tensor = entry.name;
      source->transposed = is_conv1d_weight(name);
      TORCH_CHECK(sources_.emplace(name, std::move(source)).second, "--init-from-hf ", dir,
                  " holds '", name, "' twice (with and without the \"transformer.\" prefix)");
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

HfGpt2Weights::~HfGpt2Weights() = default;

const HfGpt2Weights::Source& HfGpt2Weights::source(const std::string& name) const {
  auto it = sources_.find(name);
  TORCH_CHECK(it != sources_.end(), "--init-from-hf ", dir_, " has no tensor '", name,
              "' (nor '", kPrefix, name, "'): it is not a GPT-2 of this size");
  return *it->second;
}

void HfGpt2Weights::check(const fsdp::ParamShapes& shapes) const {
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
    TORCH_CHECK(wanted.count(name), s->file->path(), " holds '", s->tensor,
                "', which gpt_train's GPT-2 does not have (config.json and the weights disagree)");
  }
  if (!skipped_.empty()) {  // the tied head: checked for its shape only, never read
    fsdp::SafetensorsReader head(skipped_.begin()->second);
    const auto& wte = source("wte.weight");
    const std::string head_name = head.contains("lm_head.weight") ? "lm_head.weight"
                                                                   : std::string(kPrefix) + "lm_head.weight";
    TORCH_CHECK(head.entry(head_name).shape == wte.file->entry(wte.tensor).shape, head.path(),
                ": lm_head.weight's shape differs from wte's, so the head is not tied; gpt_train's "
                "GPT ties them");
  }
}

at::Tensor HfGpt2Weights::read_range(const std::string& name, int64_t begin, int64_t end) const {
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

void load_hf_gpt2(fsdp::Unit<GPT>& model, const std::string& dir) {
  HfGpt2Weights weights(dir);
  weights.check(fsdp::param_shapes(model));
  fsdp::load_params_from(model, [&](const std::string& name, int64_t begin, int64_t end) {
    return weights.read_range(name, begin, end);
  });
}

void export_hf_gpt2(const fsdp::NamedTensors& full_params, const GPTConfig& config,
                    const json& base, const std::string& dir) {
  fs::create_directories(dir);
  fsdp::NamedTensors tensors;
  for (const auto& [name, value] : full_params) {
    tensors.emplace_back(kPrefix + name, is_conv1d_weight(name) ? value.t().contiguous() : value);
  }
  fsdp::save_safetensors((fs::path(dir) / kSingleFile).string(), tensors, {{"format", "pt"}});
  json out = base.is_object() ? base : json::object();
  out["architectures"] = {"GPT2LMHeadModel"};
  out["model_type"] = "gpt2";
  out["vocab_size"] = config.vocab_size;
  out["n_positions"] = config.context();
  out["n_layer"] = config.layers;
  out["n_embd"] = config.dim;
  out["n_head"] = config.heads;
  out["n_inner"] = nullptr;
  out["activation_function"] = "gelu_new";
  out["layer_norm_epsilon"] = 1e-5;
  out["tie_word_embeddings"] = true;
  if (!base.is_object()) {  // trained without dropout, and with no special tokens
    out["resid_pdrop"] = out["embd_pdrop"] = out["attn_pdrop"] = 0.0;
    out["initializer_range"] = 0.02;
    out["bos_token_id"] = out["eos_token_id"] = nullptr;  // GPT2Config's 50256 may not exist here
  }
  out["dtype"] = "float32";
  const std::string text = out.dump(2) + "\n";
  fsdp::write_file_atomically((fs::path(dir) / "config.json").string(),
                              std::vector<char>(text.begin(), text.end()));
}

}  // namespace gpt
