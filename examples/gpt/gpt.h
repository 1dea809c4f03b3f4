#pragma once
// gpt_train's decoder, of one model family (GPTConfig::family, model_family.h), each block one
// FSDP unit:
// - GPT-2 (the default, gpt2/): a byte-level GPT with GPT-2's layout and parameter names (wte,
//   wpe, h.{i}.ln_1, h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2, h.{i}.mlp.c_fc,
//   h.{i}.mlp.c_proj, ln_f; the output head is tied to wte). Pre-LayerNorm, causal attention,
//   tanh-GELU, no dropout.
// - Llama (llama/): RMSNorm, rotary positions, grouped-query attention, a SwiGLU MLP, an untied
//   head (lm_head) or a tied one; the same slots (wte, h.{i}.ln_1, h.{i}.attn.*, h.{i}.ln_2,
//   h.{i}.mlp.*, ln_f), so that the trainer, the planner and --freeze treat both alike.
// - Qwen3 (qwen3/): the Llama's layers with an RMSNorm on each query and key head (h.{i}.attn.ln_q,
//   h.{i}.attn.ln_k) and a head_dim of its own.
// All are pre-norm residual blocks, x + attn(ln_1(x)), then + mlp(ln_2(.)). Their layers and
// sizes are one table, gpt_layers (the family's), which the modules below register and the
// planner describes.

#include "layer_table.h"

#include <fsdp/fully_shard.h>
#include <fsdp/parallelize.h>

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

// The largest sizes gpt_train builds, whether they come from its flags (--layers, --dim, ...) or
// from --init-from-hf's config.json: one bound for each, so that training and planning refuse
// the same model, and every product of them fits int64 (the planner counts bytes in int64).
constexpr int64_t kMaxLayers = 1024;            // --layers, n_layer
constexpr int64_t kMaxDim = int64_t{1} << 16;    // --dim, n_embd
constexpr int64_t kMaxHeads = int64_t{1} << 16;  // --heads, n_head
constexpr int64_t kMaxSeq = int64_t{1} << 20;    // --seq, n_positions
// config.json's n_positions (wpe's rows) may exceed the run's --seq; bounded so that wpe's
// elements (n_positions x n_embd) stay far within int64, where the planner refuses them by size.
constexpr int64_t kMaxPositions = int64_t{1} << 40;
// --vocab, vocab_size: Llama 3's 128,256 and Gemma's 256,000 within it (token files hold uint16
// or uint32 ids).
constexpr int64_t kMaxVocab = int64_t{1} << 20;
constexpr int64_t kMaxBatch = int64_t{1} << 20;  // --batch, each of --batches

/// Llama 3's scaling of the rotary frequencies (transformers' rope_type "llama3"): wavelengths
/// longer than original_context / low_freq_factor are divided by `factor`, those shorter than
/// original_context / high_freq_factor kept, those between blended.
struct Llama3RopeScaling {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_context = 8192;  // original_max_position_embeddings
};

struct GPTConfig {
  std::string family = "gpt2";  // the model family (model_family.h), as --model names it
  int64_t vocab_size = 256;  // bytes
  int64_t layers = 4;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t max_seq = 128;     // the training sequence length (--seq)
  int64_t positions = 0;     // the context length (0: max_seq): GPT-2's n_positions (rows of
                             // wpe), Llama's max_position_embeddings
  // The Llama's and Qwen3's (the GPT-2's are fixed: as many key/value heads as heads, an MLP of
  // 4·dim, a LayerNorm of epsilon 1e-5, a head tied to wte).
  int64_t kv_heads = 0;    // key/value heads, dividing heads (0: heads)
  int64_t head_dim = 0;    // channels per head (0: dim / heads)
  int64_t ffn_dim = 0;     // SwiGLU's hidden width (0: default_ffn_dim())
  double norm_eps = 1e-5;  // RMSNorm's epsilon
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tied_head = false;  // the head is wte (else a matrix of its own, lm_head)
  bool qkv_bias = false;   // Qwen2's biases on q, k and v

  int64_t context() const { return positions > 0 ? positions : max_seq; }
  int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / heads; }
  /// The MLP's hidden width (the family's).
  int64_t mlp_dim() const;
  /// Whether the output head is wte (the family's rule), else lm_head.
  bool head_is_wte() const;

  /// Throws naming the bad value (e.g. dim not divisible by heads).
  void validate() const;
  /// A configuration of the given size (byte vocabulary).
  static GPTConfig sized(int64_t layers, int64_t dim, int64_t heads, int64_t max_seq,
                         std::string family = "gpt2") {
    GPTConfig config;
    config.family = std::move(family);
    config.layers = layers;
    config.dim = dim;
    config.heads = heads;
    config.max_seq = max_seq;
    return config;
  }
};

/// Whose GPT: this project's (gpt.cpp: fused attention, tanh-GELU, head tied to wte), or
/// minGPT's (the paper's: attention scores kept for backward, dropout 0.1, GELU as elementwise
/// ops, an untied head), which only the planner describes.
enum class GptCode { ThisProject, MinGpt };

/// The model's layers, the one table that gpt.cpp's and the family's modules register and the
/// planner describes (gpt_plan.cpp), each in registration order.
struct GptLayers {
  std::vector<Layer> before_blocks;  // the root's layers registered before the blocks, "h"
  std::vector<Layer> block;          // each block's, below "h.N."
  std::vector<Layer> after_blocks;   // the root's layers after them

  /// The root's own layers: before_blocks, then after_blocks.
  std::vector<Layer> root() const;
};
GptLayers gpt_layers(const GPTConfig& config, GptCode code = GptCode::ThisProject);

/// A pre-norm residual block of any family: x + attn(ln_1(x)), then + mlp(ln_2(.)).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  // The norms the table names (LayerNorm or RMSNorm); the family's attention and MLP
  // (gpt2/gpt2.h, llama/llama.h, qwen3/qwen3.h). Held for tensor parallelism (tensor_parallel_plan.h): the
  // norms run on the sequence shard, the attention and the MLP on the gathered sequence.
  fsdp::tp::Parallel<torch::nn::AnyModule> ln_1, attn, ln_2, mlp;
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const GPTConfig& config);
  /// idx: [B, T] int64 bytes -> logits [B, T, vocab] (under tensor parallelism, this rank's
  /// chunk of the vocabulary: [B, T, vocab / tp]).
  torch::Tensor forward(const torch::Tensor& idx);
  /// The mean cross-entropy of forward's logits (lm_loss; loss parallelism under tensor
  /// parallelism).
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets);

  GPTConfig config;
  fsdp::tp::Parallel<torch::nn::Embedding> wte{nullptr};  // vocabulary-parallel under TP
  torch::nn::Embedding wpe{nullptr};  // learned positions (GPT-2's) only
  std::vector<fsdp::Unit<Block>> h;  // one FSDP unit per block; modules registered as "h.{i}"
  fsdp::tp::Parallel<torch::nn::AnyModule> ln_f;         // the norm the table names
  fsdp::tp::Parallel<UninitializedLinear> lm_head{nullptr};  // an untied head only
  /// Set by parallelize_gpt (tensor_parallel_plan.h): the group the model is split over.
  std::shared_ptr<fsdp::tp::TensorParallel> tp;
};
TORCH_MODULE(GPT);

/// GPT-2's initialisation from `seed`: normal(0, 0.02) weights, residual projections scaled by
/// 1/sqrt(2·layers), zero biases, unit LayerNorms. The same seed gives the same model anywhere
/// (each parameter drawn from its own CPU generator, seeded by parameter_seed; [Note: GPT init]).
GPT make_gpt(const GPTConfig& config, uint64_t seed);
/// GPT-2's initialisation of one parameter, by name (a path from the model or from its block),
/// drawing from `generator` (the default one when unset: fully_shard_deferred's blocks).
void init_parameter(const GPTConfig& config, const std::string& name, torch::Tensor& p,
                    std::optional<at::Generator> generator = std::nullopt);
/// The seed of the parameter `name`'s own random stream in make_gpt.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

/// Mean cross-entropy of next-byte prediction.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

/// AdamW with weight decay on matrices only (not the norms ln_*, not the biases: the 1-D
/// parameters of either architecture; decided by name, so call it before or after sharding
/// alike: the parameters stay the same tensors). `fused`: ATen's fused
/// kernel (fsdp::optim::AdamW, the default), else LibTorch's loop (torch::optim::AdamW); the same
/// state either way, so a checkpoint of one resumes with the other.
std::unique_ptr<torch::optim::AdamW> make_optimizer(GPT& model, double lr, double weight_decay,
                                                    bool fused = true);
/// The same over some of the model's parameters (`params`, named `names`: full names, e.g.
/// split_for_muon's others).
std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<std::string>& names,
                                                    const std::vector<torch::Tensor>& params,
                                                    double lr, double weight_decay, bool fused = true);

}  // namespace gpt
