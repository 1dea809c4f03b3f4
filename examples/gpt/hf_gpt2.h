#pragma once
// Hugging Face GPT-2 in and out: gpt_train --init-from-hf DIR reads a transformers GPT-2 folder
// (config.json, and model.safetensors or model.safetensors.index.json with its files), each rank
// reading only the bytes of its own shard; --export-hf DIR writes one that
// transformers.GPT2LMHeadModel.from_pretrained(DIR) loads.
//
// The mapping: the model already uses GPT-2's names (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...),
// which the files hold with or without the "transformer." prefix; GPT-2's four Conv1D weights
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are [in, out] where torch::nn::Linear's are
// [out, in], so they are transposed both ways; lm_head.weight is tied to wte (skipped when read,
// left out when written, as save_pretrained does); attn.bias / attn.masked_bias are causal-mask
// buffers, not parameters, and are skipped.

#include "gpt.h"

#include <fsdp/param_loader.h>
#include <fsdp/safetensors.h>
#include <fsdp/tensor_file.h>

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

/// config.json of a transformers GPT-2 folder, checked: every size present, and nothing this GPT
/// cannot represent (another activation than GPT-2's tanh GELU, a LayerNorm epsilon other than
/// 1e-5, an untied head, n_inner other than 4·n_embd, ...). Throws naming the file, key and fix.
struct HfGpt2Config {
  int64_t vocab_size = 0;
  int64_t n_positions = 0;  // the context length: rows of wpe
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  nlohmann::json json;  // the whole file, to write back the keys this model does not use

  static HfGpt2Config read(const std::string& dir);
};

/// The flags --layers/--dim/--heads/--seq that the user gave explicitly (others take the config's).
struct GivenSizes {
  bool layers = false, dim = false, heads = false, seq = false, vocab = false;
};

/// Sizes `model` from `hf`: vocabulary, wpe rows (n_positions), layers, width, heads; --seq (the
/// training length) defaults to n_positions and may be shorter. Throws when a flag in `given`
/// contradicts the config, naming both.
void apply_hf_config(const HfGpt2Config& hf, const std::string& dir, const GivenSizes& given,
                     GPTConfig& model);

/// The tensors of a GPT-2 folder, by the model's parameter names, read in the model's layout.
class HfGpt2Weights {
 public:
  /// Opens model.safetensors, or every file that model.safetensors.index.json names (headers only).
  explicit HfGpt2Weights(const std::string& dir);
  ~HfGpt2Weights();

  /// Every parameter of `shapes` present with its shape (Conv1D weights transposed), nothing in
  /// the files that the model lacks (but the skipped buffers and the tied head). Throws naming the
  /// file, the tensor and both shapes. The same on every rank: a bad folder fails everywhere.
  void check(const fsdp::ParamShapes& shapes) const;
  /// Elements [begin, end) of parameter `name` flattened in the model's [out, in] layout: a
  /// positioned read of just those elements, or for a Conv1D weight one short read per input row.
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t end) const;

 private:
  struct Source;
  const Source& source(const std::string& name) const;
  std::string dir_;
  std::map<std::string, std::unique_ptr<Source>> sources_;  // by the model's parameter name
  std::map<std::string, std::string> skipped_;  // the tied head's file, for check()
  std::vector<std::unique_ptr<fsdp::SafetensorsReader>> files_;
};

/// Fills this rank's shard of `model` (sharded or not) from the GPT-2 folder `dir`.
void load_hf_gpt2(fsdp::Unit<GPT>& model, const std::string& dir);

/// Writes `dir`/config.json and `dir`/model.safetensors (atomically) from the full parameters:
/// names with "transformer.", Conv1D weights transposed back, no lm_head (tied). `base`, when the
/// run started from a GPT-2 folder, keeps that config's other keys (token ids, task settings).
void export_hf_gpt2(const fsdp::NamedTensors& full_params, const GPTConfig& config,
                    const nlohmann::json& base, const std::string& dir);

}  // namespace gpt
