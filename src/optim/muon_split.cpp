// fsdp::optim::split_for_muon: a model's parameters as Keller Jordan's recipe and torch's docs
// split them between Muon (hidden matrices) and AdamW (the rest).
#include <fsdp/muon.h>

#include "core/sharded_view.h"

#include <torch/nn/modules/embedding.h>

#include <algorithm>
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

// The last part of a path ("h.0.attn" -> "attn"; the root "" -> "").
std::string last_name(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// The module path of a parameter's path ("h.0.attn.c_attn.weight" -> "h.0.attn.c_attn").
std::string module_path(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

bool is_hidden_matrix(const std::string& path, const std::vector<int64_t>& shape, bool embedding_module,
                      const std::vector<std::string>& head_names) {
  const std::string module = last_name(module_path(path));
  const bool head = module == "head" || ends_with(module, "_head") ||
                    std::find(head_names.begin(), head_names.end(), module) != head_names.end();
  return shape.size() == 2 && !embedding_module && path.find("embed") == std::string::npos && !head;
}

MuonSplit split_for_muon(const torch::nn::Module& model, const std::vector<std::string>& head_names) {
  const auto shapes = original_shapes(model);
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
      const bool embedding = dynamic_cast<const torch::nn::EmbeddingImpl*>(&module) != nullptr;
      const bool hidden_matrix = is_hidden_matrix(name, shape, embedding, head_names);
      (hidden_matrix ? split.matrices : split.others).push_back(p);
      (hidden_matrix ? split.matrix_names : split.other_names).push_back(name);
    }
  }
  return split;
}

}  // namespace fsdp::optim
