#pragma once
// [Note: a model family is a folder]
// gpt_train's recipe (the trainer, the command line, checkpointing, the data, the step, the
// planner's view) is one for every model family; what differs between families lives in the
// family's folder (gpt2/, llama/, qwen3/): its layers and modules, its flags and checks, its Hugging Face
// config and weight names, and its blocks described to the planner. Each folder exposes one
// ModelFamily, and the recipe calls it through GPTConfig::family (family_of) without asking which
// family it is. A new family is a new folder (with a CMakeLists.txt adding its sources to gpt_lib,
// which examples/gpt/CMakeLists.txt finds by itself) and one line in model_families.inc.

#include "gpt.h"
#include "hf_folder.h"

#include <fsdp/plan.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace gpt {

/// config.json's keys of the sizes that gpt_train's flags also set, for messages.
struct HfSizeKeys {
  const char* layers;
  const char* dim;
  const char* heads;
  const char* vocab;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // The family by name and in messages.
  /// --model's value and the checkpoint's "model" setting: "gpt2", "llama".
  virtual std::string name() const = 0;
  /// --model's help for this value, e.g. "GPT-2's architecture (LayerNorm, ...)".
  virtual std::string help() const = 0;
  /// What a config.json of this family holds, for messages: "GPT-2", "Llama-family model".
  virtual std::string model_text() const = 0;
  /// The planner's name of the model: "GPT", "Llama".
  virtual std::string plan_kind() const = 0;

  // Its settings.
  /// Adds the flags of this family (bound to `model`), in --help's order; their help without the
  /// "--model NAME: " that the command line puts before it. A flag that several families take
  /// (each lists it in flags()) is added once: by one of them, which the others call or leave it to.
  virtual void add_flags(CLI::App& app, GPTConfig& model) const = 0;
  /// The names of the flags this family takes ("--kv-heads"): refused with a family that does not
  /// take them and with --init-from-hf.
  virtual std::vector<std::string> flags() const = 0;
  /// Throws naming the bad value of a setting of this family (the shared ones checked already).
  virtual void validate(const GPTConfig& config) const = 0;
  /// The MLP's hidden width.
  virtual int64_t mlp_dim(const GPTConfig& config) const = 0;
  /// Whether the output head is wte (else lm_head, a matrix of its own).
  virtual bool head_is_wte(const GPTConfig& config) const = 0;

  // Its model.
  /// The layer table (gpt.h's slots) that the modules register and the planner describes.
  virtual GptLayers layers(const GPTConfig& config, GptCode code) const = 0;
  /// A block's attention and MLP, registering their rows of the table ("attn.", "mlp.").
  virtual torch::nn::AnyModule attention(const GPTConfig& config) const = 0;
  virtual torch::nn::AnyModule mlp(const GPTConfig& config) const = 0;

  // Its Hugging Face folders (hf_folder.h).
  /// config.json's model_type values this family loads.
  virtual std::vector<std::string> hf_model_types() const = 0;
  /// Those types for the message that lists what gpt_train loads: "\"gpt2\"".
  virtual std::string hf_types_text() const = 0;
  /// The model of a checked config.json (`where`: its path, for messages).
  virtual GPTConfig hf_config(const nlohmann::json& config, const std::string& where) const = 0;
  virtual HfSizeKeys hf_size_keys() const = 0;
  /// The key that bounds the sequence the model trains on, and what it is (for messages).
  virtual std::pair<std::string, std::string> hf_context_limit(const nlohmann::json& config,
                                                               const GPTConfig& model,
                                                               const std::string& where) const = 0;
  /// A config that ties the head beside files that hold a head of their own with other values:
  /// transformers loads that head untied; unties `model`'s, or throws when the family cannot.
  virtual void untie_head(GPTConfig& model, const std::string& where) const = 0;
  virtual HfNaming hf_naming(const GPTConfig& config) const = 0;
  /// config.json for --export-hf; `base`, when an object, keeps the started-from config's keys.
  virtual nlohmann::json hf_config_json(const GPTConfig& config, const nlohmann::json& base) const = 0;

  // Its description to the planner (gpt_plan.cpp's describe_gpt).
  /// What block `unit` (its name and parameters set) computes and keeps for backward, in
  /// `element_bytes` per element of the compute dtype, on one of `tp` tensor-parallel ranks
  /// (sequence parallel: [Note: tensor parallelism in the plan], src/plan/plan_tensor_parallel.h).
  virtual void describe_block(const GPTConfig& config, int64_t element_bytes, GptCode code, int64_t tp,
                              fsdp::PlanUnit& unit) const = 0;

  // Its tensor parallelism (tensor_parallel_plan.h).
  /// How a block's attention and MLP layers split (paths below the block: "attn.q_proj"):
  /// column-wise into the heads and the hidden width, row-wise out of them.
  virtual fsdp::tp::ParallelizePlan block_parallel_plan(const GPTConfig& config) const = 0;
};

/// The families gpt_train knows, in --model's order.
const std::vector<const ModelFamily*>& model_families();
/// The family named `name`; throws naming the known ones.
const ModelFamily& family_named(const std::string& name);
/// `config`'s family (config.family).
const ModelFamily& family_of(const GPTConfig& config);
/// The families whose flags() list `flag`, for its help and messages: "llama", "llama, qwen3".
std::string families_taking(const std::string& flag);
/// Adds every family's flags (add_flags), each flag's help led by the families that take it:
/// "--model llama: key/value heads ...".
void add_family_flags(CLI::App& app, GPTConfig& model);

}  // namespace gpt
