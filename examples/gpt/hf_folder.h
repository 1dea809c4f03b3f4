#pragma once
// Hugging Face folders in and out: gpt_train --init-from-hf DIR reads a transformers folder
// (config.json, and model.safetensors or model.safetensors.index.json with its files), each rank
// reading only the bytes of its own shard; --export-hf DIR writes one that transformers'
// from_pretrained(DIR) loads with no missing or unexpected keys. config.json's model_type picks
// the model family (model_family.h) whose hf_model_types() hold it: "gpt2" (GPT2LMHeadModel,
// gpt2/hf_gpt2.cpp), the Llama family's "llama", "mistral", "qwen2" (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM; llama/hf_llama.cpp) or "qwen3" (Qwen3ForCausalLM;
// qwen3/hf_qwen3.cpp).
// What the model cannot represent is refused by name, naming the key and what can be loaded.

#include "gpt.h"

#include <fsdp/param_loader.h>
#include <fsdp/safetensors.h>
#include <fsdp/tensor_file.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

/// A folder's config.json, checked, as gpt_train's model configuration.
struct HfConfig {
  GPTConfig model;      // family and sizes; max_seq is the context (--seq may shorten it)
  nlohmann::json json;  // the whole file, to write back the keys this model does not use

  /// `dir`/config.json: every size present and bounded, and nothing the model cannot represent.
  /// Throws naming the file, the key and the fix.
  static HfConfig read(const std::string& dir);
  /// `dir`/config.json as JSON, checked to be an object (for --export-hf to keep its other keys).
  static nlohmann::json read_json(const std::string& dir);
};

/// The flags --layers/--dim/--heads/--seq/--vocab that the user gave explicitly (others take the
/// config's).
struct GivenSizes {
  bool layers = false, dim = false, heads = false, seq = false, vocab = false;
};

/// Sizes `model` from `hf` (family, vocabulary, layers, width, heads, ...); --seq (the
/// training length) defaults to the context and may be shorter. Throws when a flag in `given`
/// contradicts the config, naming both.
void apply_hf_config(const HfConfig& hf, const std::string& dir, const GivenSizes& given,
                     GPTConfig& model);

/// How a family's parameters are named and laid out in the files.
struct HfNaming {
  /// The model's name of the file's tensor `file_name`; "" for a tensor that is not a parameter
  /// (a causal-mask buffer, an old checkpoint's rotary frequencies).
  std::function<std::string(const std::string&)> model_name;
  /// The file's name of the model's parameter `name` (for --export-hf).
  std::function<std::string(const std::string&)> file_name;
  /// Whether the model's [out, in] weight `name` is stored [in, out] (GPT-2's Conv1D).
  std::function<bool(const std::string&)> transposed;
  /// lm_head.weight is wte (skipped when read, shape-checked, left out when written).
  bool tied_head = true;
  std::string kind;  // "GPT-2", "Llama": for messages
};

/// The tensors of a folder, by the model's parameter names, read in the model's layout.
class HfWeights {
 public:
  /// Opens model.safetensors, or every file that model.safetensors.index.json names (headers only).
  HfWeights(const std::string& dir, HfNaming naming);
  ~HfWeights();

  /// Every parameter of `shapes` present with its shape (transposed ones reversed), nothing in
  /// the files that the model lacks (but skipped buffers and a tied head). Throws naming the
  /// file, the tensor and both shapes. The same on every rank: a bad folder fails everywhere.
  void check(const fsdp::ParamShapes& shapes) const;
  /// Elements [begin, end) of parameter `name` flattened in the model's [out, in] layout: a
  /// positioned read of just those elements, or for a transposed weight one short read per row.
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t end) const;
  /// Whether the files hold an lm_head.weight of their own beside a tied head's embedding, with
  /// other values: transformers then leaves the head untied (and warns).
  bool holds_own_head() const;

 private:
  void check_second_copy(const fsdp::SafetensorsReader& file, const std::string& tensor,
                         const std::string& listed) const;
  struct Source;
  const Source& source(const std::string& name) const;
  std::string dir_;
  HfNaming naming_;
  std::map<std::string, std::unique_ptr<Source>> sources_;  // by the model's parameter name
  std::string tied_head_file_, tied_head_tensor_;  // a tied head's file and name, for check()
  std::vector<std::unique_ptr<fsdp::SafetensorsReader>> files_;
};

/// Fills this rank's shard of `model` (sharded or not) from the folder `dir`.
void load_hf(fsdp::Unit<GPT>& model, const std::string& dir);

/// Writes `dir`/config.json and `dir`/model.safetensors (atomically) from the full parameters, in
/// the family's names and layouts. `base`, when the run started from a folder, keeps that
/// config's other keys (token ids, task settings).
void write_hf_folder(const fsdp::NamedTensors& full_params, const GPTConfig& config,
               const nlohmann::json& base, const std::string& dir);

// The checks of config.json that the families' readers share (gpt2/hf_gpt2.cpp,
// llama/hf_llama.cpp, qwen3/hf_qwen3.cpp).
namespace hf {

/// config[key]: a positive whole number at most `max` (`bound` says whose: training and
/// planning refuse the same model).
int64_t positive_size(const nlohmann::json& config, const std::string& key, const std::string& path,
                      int64_t max, const char* bound);
/// A key that the model cannot represent otherwise: absent (transformers' default) or `expected`.
void require(const nlohmann::json& config, const std::string& key, const nlohmann::json& expected,
             const std::string& path, const std::string& why);
/// config[key] as a positive finite number, or `fallback` when absent.
double positive_number(const nlohmann::json& config, const std::string& key, double fallback,
                       const std::string& path);
/// config[key] as a boolean, or `fallback` when absent or null; another type (a string "true")
/// throws naming the key and the file.
bool boolean(const nlohmann::json& config, const std::string& key, bool fallback, const std::string& path);
/// config[key] as a string, or `fallback` when absent or null; another type throws naming the key.
std::string text(const nlohmann::json& config, const std::string& key, const std::string& fallback,
                 const std::string& path);
bool ends_with(const std::string& name, const std::string& suffix);
/// Whether tensor `a_name` of `a` and `b_name` of `b` have one shape and equal values.
bool same_values(const fsdp::SafetensorsReader& a, const std::string& a_name,
                 const fsdp::SafetensorsReader& b, const std::string& b_name);

}  // namespace hf

}  // namespace gpt
