#include "gpt.h"

#include <fsdp/fused_adamw.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>

namespace gpt {

void GPTConfig::validate() const {
  TORCH_CHECK(layers >= 1, "--layers must be >= 1, got ", layers);
  TORCH_CHECK(dim >= 1 && heads >= 1 && dim % heads == 0, "--dim (", dim,
              ") must be a positive multiple of --heads (", heads, ")");
  TORCH_CHECK(max_seq >= 2, "--seq must be >= 2, got ", max_seq);
  TORCH_CHECK(positions == 0 || positions >= max_seq, "--seq ", max_seq,
              " is longer than the model's context of ", positions, " positions");
}

UninitializedLinearImpl::UninitializedLinearImpl(int64_t in_features, int64_t out_features) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  bias = register_parameter("bias", torch::empty({out_features}));
}

torch::Tensor UninitializedLinearImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, weight, bias);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& config) : heads(config.heads) {
  c_attn = register_module("c_attn", UninitializedLinear(config.dim, 3 * config.dim));
  c_proj = register_module("c_proj", UninitializedLinear(config.dim, config.dim));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  auto qkv = c_attn(x).split(C, /*dim=*/2);
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({B, T, heads, C / heads}).transpose(1, 2);  // [B, heads, T, head_dim]
  };
  auto y = at::scaled_dot_product_attention(heads_first(qkv[0]), heads_first(qkv[1]),
                                            heads_first(qkv[2]), /*attn_mask=*/{},
                                            /*dropout_p=*/0.0, /*is_causal=*/true);
  return c_proj(y.transpose(1, 2).contiguous().view({B, T, C}));
}

MLPImpl::MLPImpl(const GPTConfig& config) {
  c_fc = register_module("c_fc", UninitializedLinear(config.dim, 4 * config.dim));
  c_proj = register_module("c_proj", UninitializedLinear(4 * config.dim, config.dim));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return c_proj(torch::gelu(c_fc(x), "tanh"));
}

BlockImpl::BlockImpl(const GPTConfig& config) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})));
  mlp = register_module("mlp", MLP(config));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

GPTImpl::GPTImpl(const GPTConfig& cfg) : config(cfg) {
  config.validate();
  // The blocks are built before the embeddings: under fully_shard_deferred each block is sharded
  // as soon as it is built, so a whole block and the embeddings (the largest tensors) never exist
  // at once. Registered after them all the same: parameter order and names stay GPT-2's.
  auto blocks = torch::nn::ModuleList();
  for (int64_t i = 0; i < config.layers; ++i) {
    Block block(config);
    blocks->push_back(block);
    h.emplace_back(block);
  }
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.dim));
  wpe = register_module("wpe", torch::nn::Embedding(config.context(), config.dim));
  register_module("h", blocks);
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})));
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config.context(), "sequence of ", T, " tokens is longer than the model's ",
              config.context());
  auto positions = torch::arange(T, idx.options().dtype(torch::kLong));
  auto x = wte(idx) + wpe(positions);
  for (auto& block : h) x = block(x);
  return torch::matmul(ln_f(x), wte->weight.t());  // head tied to wte
}

void init_parameter(const GPTConfig& config, const std::string& name, torch::Tensor& p,
                    std::optional<at::Generator> generator) {
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * config.layers);
  const bool is_layer_norm = name.find("ln_") != std::string::npos;
  if (is_layer_norm) {
    p.fill_(name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0 ? 1.0 : 0.0);
  } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
    p.zero_();
  } else if (name.find("c_proj.weight") != std::string::npos) {
    p.normal_(0.0, residual_std, generator);
  } else {
    p.normal_(0.0, 0.02, generator);
  }
}

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a of the name, then of the seed's bytes
  const auto mix = [&](unsigned char byte) { hash = (hash ^ byte) * 1099511628211ull; };
  for (const char c : name) mix(static_cast<unsigned char>(c));
  for (int i = 0; i < 8; ++i) mix(static_cast<unsigned char>(seed >> (8 * i)));
  return hash;
}

GPT make_gpt(const GPTConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  GPT model(config);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  // [Note: GPT init] One random stream per parameter, seeded from (seed, name): the draws of a
  // 1.3 B model (one serial stream took ~12 s of each run's start-up) spread over the cores, and
  // the weights depend on neither the thread count nor the parameters' order.
  at::parallel_for(0, static_cast<int64_t>(params.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      auto& [name, p] = params[i];
      init_parameter(config, name, p,
                     at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, name)));
    }
  });
  return model;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // In fp32 even when the model computes in bf16/fp16 (mixed precision): a low-precision
  // log-softmax over the vocabulary would round the loss and its gradient needlessly.
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(GPT& model, double lr, double weight_decay,
                                                    bool fused) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& item : model->named_parameters()) {
    const bool is_matrix = item.key().find("ln_") == std::string::npos &&
                           item.key().find("bias") == std::string::npos;
    (is_matrix ? decay : no_decay).push_back(item.value());
  }
  auto options = torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(weight_decay);
  auto no_decay_options = options;
  no_decay_options.weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(no_decay_options));
  if (fused) return std::make_unique<fsdp::optim::AdamW>(std::move(groups), options);
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

}  // namespace gpt
