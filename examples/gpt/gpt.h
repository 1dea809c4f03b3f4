#pragma once
// A byte-level GPT with GPT-2's layout and parameter names (wte, wpe, h.{i}.ln_1, h.{i}.attn.c_attn,
// h.{i}.attn.c_proj, h.{i}.ln_2, h.{i}.mlp.c_fc, h.{i}.mlp.c_proj, ln_f; the output head is tied
// to wte). Pre-LayerNorm, causal attention, tanh-GELU, no dropout. Each block is one FSDP unit.
// Its layers and their sizes are one table, gpt_layers, which the modules below register.

#include "layer_table.h"

#include <fsdp/fully_shard.h>

#include <torch/torch.h>

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
constexpr int64_t kMaxVocab = int64_t{1} << 16;  // --vocab, vocab_size (token ids are uint16)
constexpr int64_t kMaxBatch = int64_t{1} << 20;  // --batch, each of --batches

struct GPTConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t layers = 4;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t max_seq = 128;     // the training sequence length (--seq)
  int64_t positions = 0;     // rows of wpe, the context length (0: max_seq); a GPT-2's n_positions

  int64_t context() const { return positions > 0 ? positions : max_seq; }

  /// Throws naming the bad value (e.g. dim not divisible by heads).
  void validate() const;
  /// A configuration of the given size (byte vocabulary).
  static GPTConfig sized(int64_t layers, int64_t dim, int64_t heads, int64_t max_seq) {
    GPTConfig config;
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

/// The GPT's layers, the one table that gpt.cpp's modules register and the planner describes
/// (gpt_plan.cpp), each in registration order.
struct GptLayers {
  std::vector<Layer> before_blocks;  // the root's layers registered before the blocks, "h"
  std::vector<Layer> block;          // each block's, below "h.N."
  std::vector<Layer> after_blocks;   // the root's layers after them

  /// The root's own layers: before_blocks, then after_blocks.
  std::vector<Layer> root() const;
};
GptLayers gpt_layers(const GPTConfig& config, GptCode code = GptCode::ThisProject);

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // x: [B, T, dim]

  int64_t heads;
  UninitializedLinear c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  UninitializedLinear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(MLP);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const GPTConfig& config);
  /// idx: [B, T] int64 bytes -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& idx);

  GPTConfig config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<fsdp::Unit<Block>> h;  // one FSDP unit per block; modules registered as "h.{i}"
  torch::nn::LayerNorm ln_f{nullptr};
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

/// AdamW with weight decay on matrices only (decided from the original shapes, so call it
/// before or after sharding alike: the parameters stay the same tensors). `fused`: ATen's fused
/// kernel (fsdp::optim::AdamW, the default), else LibTorch's loop (torch::optim::AdamW); the same
/// state either way, so a checkpoint of one resumes with the other.
std::unique_ptr<torch::optim::AdamW> make_optimizer(GPT& model, double lr, double weight_decay,
                                                    bool fused = true);

}  // namespace gpt
