#pragma once
// A model's layers as one table (llm.c's way: one size table both allocates and plans): each row
// names a layer by its path in the model, its kind and its sizes. The model's modules register
// their layers from it (register_layers) and the planner lists the same parameters from it
// (layer_params), so the two cannot describe different models.

#include <fsdp/plan.h>

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace gpt {

enum class LayerKind {
  Linear,     // weight [out, in], bias [out]; its weights left uninitialised (UninitializedLinear)
  LayerNorm,  // weight [in], bias [in] (torch::nn::LayerNorm over the last dimension, of size in)
  RMSNorm,    // weight [in] (RMSNorm below)
  Embedding,  // weight [in, out]: `in` rows (the vocabulary, the positions) of width `out`
};

struct Layer {
  std::string name;  // its path below the table's module: "ln_1", "attn.c_attn"
  LayerKind kind;
  int64_t in = 0, out = 0;
  bool bias = true;
  double eps = 1e-5;  // the norms'
};

/// torch::nn::Linear without its constructor's kaiming-uniform draw, which make_gpt (or the
/// deferred init) overwrites unread: at 1.3 B parameters that draw, one serial RNG stream, took
/// ~7 s of each process's start-up. Same parameter names (weight [out, in], bias [out]) and math.
struct UninitializedLinearImpl : torch::nn::Module {
  UninitializedLinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias;
};
TORCH_MODULE(UninitializedLinear);

/// Llama's RMSNorm as transformers computes it: in fp32 whatever the input's dtype,
/// weight · (x / sqrt(mean(x²) + eps)), the normalised x cast back to the input's dtype before the
/// weight multiplies it (llama/rms_norm.h: one autograd node in fp32).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  double eps;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

/// `layer`'s parameters, each name prefixed by `prefix` ("h.3."), in registration order.
std::vector<fsdp::PlanParam> layer_params(const Layer& layer, const std::string& prefix);

/// Registers on `module`, in the table's order, the layers of `table` directly below `prefix`
/// ("" for the table's own module, "attn." for its attention). A row one level deeper
/// ("attn.c_attn" below "") registers at its group's first row the submodule that
/// `make_group(group)` returns ("attn"), which registers its own rows.
void register_layers(
    torch::nn::Module& module, const std::vector<Layer>& table, const std::string& prefix,
    const std::function<std::shared_ptr<torch::nn::Module>(const std::string&)>& make_group = {});

/// The child `name` of `module` as registered by register_layers, typed: Holder is its
/// module holder (torch::nn::LayerNorm, UninitializedLinear, ...).
template <class Holder>
Holder child(torch::nn::Module& module, const std::string& name) {
  auto impl = std::dynamic_pointer_cast<typename Holder::ContainedType>(module.named_children()[name]);
  TORCH_CHECK(impl, "the model has no ", name, " of the layer table's kind");
  return Holder(impl);
}

/// The row of `table` named `name`, or nullptr.
const Layer* find_layer(const std::vector<Layer>& table, const std::string& name);

/// The norm `name` of `module` as register_layers built it from `table`'s row: a LayerNorm or an
/// RMSNorm, as the row's kind says.
torch::nn::AnyModule norm_child(torch::nn::Module& module, const std::vector<Layer>& table,
                                const std::string& name);

}  // namespace gpt
