#include "gpt.h"

#include "model_family.h"

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
  family_of(*this).validate(*this);
}

int64_t GPTConfig::mlp_dim() const { return family_of(*this).mlp_dim(*this); }

bool GPTConfig::head_is_wte() const { return family_of(*this).head_is_wte(*this); }

GptLayers gpt_layers(const GPTConfig& config, GptCode code) {
  return family_of(config).layers(config, code);
}

std::vector<Layer> GptLayers::root() const {
  std::vector<Layer> root = before_blocks;
  root.insert(root.end(), after_blocks.begin(), after_blocks.end());
  return root;
}

BlockImpl::BlockImpl(const GPTConfig& config) {
  const ModelFamily& family = family_of(config);
  const auto make_group = [&](const std::string& group) -> std::shared_ptr<torch::nn::Module> {
    if (group == "attn") {
      attn = family.attention(config);
      return attn.ptr();
    }
    TORCH_CHECK(group == "mlp", "a block has no ", group);
    mlp = family.mlp(config);
    return mlp.ptr();
  };
  const std::vector<Layer> table = gpt_layers(config).block;
  register_layers(*this, table, "", make_group);
  ln_1 = norm_child(*this, table, "ln_1");
  ln_2 = norm_child(*this, table, "ln_2");
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn.forward(ln_1.forward(x));
  return y + mlp.forward(ln_2.forward(y));
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
  const GptLayers layers = gpt_layers(config);
  register_layers(*this, layers.before_blocks, "");
  register_module("h", blocks);
  register_layers(*this, layers.after_blocks, "");
  wte = child<torch::nn::Embedding>(*this, "wte");
  if (find_layer(layers.before_blocks, "wpe")) wpe = child<torch::nn::Embedding>(*this, "wpe");
  ln_f = norm_child(*this, layers.after_blocks, "ln_f");
  if (!config.head_is_wte()) lm_head = child<UninitializedLinear>(*this, "lm_head");
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config.context(), "sequence of ", T, " tokens is longer than the model's ",
              config.context());
  auto x = wte(idx);  // under tensor parallelism, this rank's part of the sequence
  if (wpe) {           // Llama: RoPE
    const torch::Tensor positions = wpe(torch::arange(T, idx.options().dtype(torch::kLong)));
    x = x + (tp ? tp->chunk_along(positions, 0) : positions);
  }
  for (auto& block : h) x = block(x);
  x = ln_f.forward(x);
  if (lm_head) return lm_head(x);
  // The tied head: the whole sequence against this rank's rows of wte.
  return torch::matmul(tp ? tp->gather_sequence(x) : x, wte->weight.t());
}

torch::Tensor GPTImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return tp ? tp->cross_entropy(logits, targets) : lm_loss(logits, targets);
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
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (auto& item : model->named_parameters()) {
    names.push_back(item.key());
    params.push_back(item.value());
  }
  return make_optimizer(names, params, lr, weight_decay, fused);
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<std::string>& names,
                                                    const std::vector<torch::Tensor>& params,
                                                    double lr, double weight_decay, bool fused) {
  TORCH_CHECK(names.size() == params.size(), "make_optimizer: ", names.size(), " names for ",
              params.size(), " parameters");
  std::vector<torch::Tensor> decay, no_decay;
  for (size_t i = 0; i < names.size(); ++i) {
    const bool is_matrix = names[i].find("ln_") == std::string::npos &&
                           names[i].find("bias") == std::string::npos;
    (is_matrix ? decay : no_decay).push_back(params[i]);
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
