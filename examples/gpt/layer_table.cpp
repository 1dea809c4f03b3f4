#include "layer_table.h"

#include "llama/rms_norm.h"

#include <set>

namespace gpt {

UninitializedLinearImpl::UninitializedLinearImpl(int64_t in_features, int64_t out_features,
                                                 bool bias) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", torch::empty({out_features}));
}

torch::Tensor UninitializedLinearImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, weight, bias);
}

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps); }

std::vector<fsdp::PlanParam> layer_params(const Layer& layer, const std::string& prefix) {
  const std::string name = prefix + layer.name;
  switch (layer.kind) {
    case LayerKind::Linear:
      if (!layer.bias) return {{name + ".weight", {layer.out, layer.in}}};
      return {{name + ".weight", {layer.out, layer.in}}, {name + ".bias", {layer.out}}};
    case LayerKind::LayerNorm:
      if (!layer.bias) return {{name + ".weight", {layer.in}}};
      return {{name + ".weight", {layer.in}}, {name + ".bias", {layer.in}}};
    case LayerKind::RMSNorm:
      return {{name + ".weight", {layer.in}}};
    case LayerKind::Embedding:
      return {{name + ".weight", {layer.in, layer.out}}};
  }
  TORCH_CHECK(false, name, ": a layer of no known kind");
}

namespace {

std::shared_ptr<torch::nn::Module> build_layer(const Layer& layer) {
  switch (layer.kind) {
    case LayerKind::Linear:
      return UninitializedLinear(layer.in, layer.out, layer.bias).ptr();
    case LayerKind::LayerNorm:
      TORCH_CHECK(layer.bias, layer.name, ": torch::nn::LayerNorm has a bias");
      return torch::nn::LayerNorm(torch::nn::LayerNormOptions({layer.in}).eps(layer.eps)).ptr();
    case LayerKind::RMSNorm:
      return RMSNorm(layer.in, layer.eps).ptr();
    case LayerKind::Embedding:
      return torch::nn::Embedding(layer.in, layer.out).ptr();
  }
  TORCH_CHECK(false, layer.name, ": a layer of no known kind");
}

}  // namespace

const Layer* find_layer(const std::vector<Layer>& table, const std::string& name) {
  for (const Layer& layer : table) {
    if (layer.name == name) return &layer;
  }
  return nullptr;
}

torch::nn::AnyModule norm_child(torch::nn::Module& module, const std::vector<Layer>& table,
                                const std::string& name) {
  const Layer* layer = find_layer(table, name);
  TORCH_CHECK(layer, "the layer table has no ", name);
  if (layer->kind == LayerKind::RMSNorm) return torch::nn::AnyModule(child<RMSNorm>(module, name));
  TORCH_CHECK(layer->kind == LayerKind::LayerNorm, name, " is not a norm in the layer table");
  return torch::nn::AnyModule(child<torch::nn::LayerNorm>(module, name));
}

void register_layers(
    torch::nn::Module& module, const std::vector<Layer>& table, const std::string& prefix,
    const std::function<std::shared_ptr<torch::nn::Module>(const std::string&)>& make_group) {
  std::set<std::string> groups;
  for (const Layer& layer : table) {
    if (layer.name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string below = layer.name.substr(prefix.size());
    const size_t dot = below.find('.');
    if (dot == std::string::npos) {
      module.register_module(below, build_layer(layer));
      continue;
    }
    const std::string group = below.substr(0, dot);
    if (groups.insert(group).second) module.register_module(group, make_group(group));
  }
}

}  // namespace gpt
