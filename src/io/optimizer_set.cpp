#include "io/optimizer_set.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace fsdp::detail {

namespace {

using torch::optim::Optimizer;

// "optimizer 1 (an AdamW)": how errors name one of several.
std::string describe(size_t k, const std::string& name) {
  return "optimizer " + std::to_string(k) + " (" + a_class(name) + ")";
}

// How errors name a tensor: the model's name for it, else its shape.
std::string tensor_name(const std::map<const void*, std::string>& names, const at::Tensor& t) {
  auto it = names.find(t.unsafeGetTensorImpl());
  if (it != names.end()) return "parameter '" + it->second + "'";
  std::ostringstream shape;
  shape << t.sizes();
  return "a tensor of shape " + shape.str();
}

}  // namespace

std::string a_class(const std::string& name) {
  const bool vowel = !name.empty() && std::string("AEIOU").find(name[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + name;
}

OptimizerSet::OptimizerSet(const std::vector<Optimizer*>& optimizers, const ShardedView& model,
                           const std::string& what)
    : optimizers_(optimizers) {
  TORCH_CHECK(!optimizers.empty(), what, ": no optimizer given: pass the optimizers that step the "
              "model (a checkpoint holds their state with the parameters)");
  for (size_t k = 0; k < optimizers.size(); ++k) {
    TORCH_CHECK(optimizers[k], what, ": optimizer ", k, " is null: pass the optimizers themselves");
    for (size_t j = 0; j < k; ++j) {
      TORCH_CHECK(optimizers[j] != optimizers[k], what, ": optimizers ", j, " and ", k,
                  " are the same optimizer: list each once");
    }
    states_.emplace_back(*optimizers[k], what);
  }
  std::map<const void*, std::string> names;
  for (const auto& p : model.params()) names.emplace(p.param().unsafeGetTensorImpl(), p.name());
  for (size_t k = 0; k < optimizers.size(); ++k) {
    for (const auto& group : optimizers[k]->param_groups()) {
      for (const auto& p : group.params()) {
        const auto [it, first] = holder_.emplace(p.unsafeGetTensorImpl(), k);
        // One parameter, two states under one name: which would the checkpoint hold?
        TORCH_CHECK(first || it->second == k, what, ": ", tensor_name(names, p), " is in ",
                    describe(it->second, states_[it->second].name()), " and in ",
                    describe(k, states_[k].name()), ": each parameter must be stepped by one "
                    "optimizer; build each over its own parameters (fsdp::optim::split_for_muon "
                    "splits a model's for Muon and AdamW)");
      }
    }
  }
}

std::vector<std::string> OptimizerSet::names() const {
  std::vector<std::string> out;
  for (const auto& s : states_) out.push_back(s.name());
  return out;
}

std::string OptimizerSet::name() const {
  std::string out;
  for (const auto& s : states_) out += (out.empty() ? "" : "+") + s.name();
  return out;
}

std::vector<std::string> OptimizerSet::kinds_in_use() const {
  std::vector<std::string> kinds;
  for (const auto& s : states_) {
    for (const auto& kind : s.kinds_in_use()) {
      if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    }
  }
  return kinds;
}

std::optional<size_t> OptimizerSet::holder(const at::Tensor& param) const {
  auto it = holder_.find(param.unsafeGetTensorImpl());
  if (it == holder_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::vector<std::string>> OptimizerSet::kinds_needed(const at::Tensor& param,
                                                                   const StagedOptions& options) const {
  const auto k = holder(param);
  if (!k) return std::nullopt;
  return options.empty() ? states_[*k].kinds_needed(param) : states_[*k].kinds_needed(param, options.at(*k));
}

std::optional<ParamOptimState> OptimizerSet::read(const at::Tensor& param) const {
  const auto k = holder(param);
  if (!k) return std::nullopt;
  return states_[*k].read(param);
}

void OptimizerSet::write(const at::Tensor& param, const std::optional<ParamOptimState>& state) {
  if (const auto k = holder(param)) states_[*k].write(param, state);
}

}  // namespace fsdp::detail
