// fsdp::optim::split_for_muon: a model's parameters as Keller Jordan's recipe and torch's docs
// split them between Muon (hidden matrices) and AdamW (the rest).
#include <fsdp/muon.h>

#include "core/sharded_view.h"

#include <torch/nn/modules/embedding.h>

#include <unordered_map>
#include <unordered_set>

namespace fsdp::optim {
namespace {

// Each sharded parameter's original shape (a sharded parameter is a 1-D piece between steps).
std::unordered_map<const void*, std::vector<int64_t>> original_shapes(const torch::nn::Module& module) {
  std::unordered_map<const void*, std::vector<int64_t>> shapes;
  for (const auto& model : detail::models_holding(module.parameters())) {
    for (const auto& p : detail::ShardedView(model).params()) {
      shapes.emplace(p.param().unsafeGetTensorImpl(), p.shape());
    }
  }
  return shapes;
}

// The last part of a module path ("h.0.attn" -> "attn"; the root "" -> "").
std::string last_name(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

bool is_embedding(const torch::nn::Module& module, const std::string& module_path, const std::string& param_name) {
  if (dynamic_cast<const torch::nn::EmbeddingImpl*>(&module)) return true;
  return (module_path + "." + param_name).find("embed") != std::string::npos;
}

}  // namespace

MuonSplit split_for_muon(const torch::nn::Module& model, const std::vector<std::string>& head_names) {
  const auto shapes = original_shapes(model);
  const std::unordered_set<std::string> heads(head_names.begin(), head_names.end());
  std::unordered_set<const void*> seen;
  MuonSplit split;
  for (const auto& item : model.named_modules()) {
    const std::string& path = item.key();
    const torch::nn::Module& module = *item.value();
    for (const auto& param : module.named_parameters(/*recurse=*/false)) {
      const at::Tensor& p = param.value();
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      const auto shape = shapes.count(p.unsafeGetTensorImpl()) ? shapes.at(p.unsafeGetTensorImpl()) : p.sizes().vec();
      const std::string name = path.empty() ? param.key() : path + "." + param.key();
      const bool hidden_matrix = shape.size() == 2 && !is_embedding(module, path, param.key()) &&
                                 !heads.count(last_name(path));
      (hidden_matrix ? split.matrices : split.others).push_back(p);
      (hidden_matrix ? split.matrix_names : split.other_names).push_back(name);
    }
  }
  return split;
}

}  // namespace fsdp::optim
