#include "io/param_groups.h"

#include "io/optimizer_options.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>

namespace fsdp::detail {

namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;

std::map<const void*, std::string> names_of_params(const ShardedView& model) {
  std::map<const void*, std::string> names;
  for (const auto& p : model.params()) names.emplace(p.param().unsafeGetTensorImpl(), p.name());
  return names;
}

// The names of optimizer `k`'s group `g`'s parameters but `siblings`; throws at a tensor that is
// not one of the model's.
std::vector<std::string> group_names(const std::map<const void*, std::string>& names, const OptimizerSet& optimizers,
                                     size_t k, size_t g, const std::string& what,
                                     const std::set<const void*>& siblings) {
  std::vector<std::string> out;
  const auto& params = optimizers.optimizer(k).param_groups()[g].params();
  const std::string group = optimizers.size() == 1 ? "the optimizer's param group " + std::to_string(g)
                                                   : "optimizer " + std::to_string(k) + "'s (" +
                                                         optimizers.state(k).name() + ") param group " +
                                                         std::to_string(g);
  for (size_t i = 0; i < params.size(); ++i) {
    if (siblings.count(params[i].unsafeGetTensorImpl())) continue;  // another stage's
    auto it = names.find(params[i].unsafeGetTensorImpl());
    TORCH_CHECK(it != names.end(), what, ": ", group, " holds, at position ",
                i, ", a tensor of shape ", params[i].sizes(), " that is not a parameter of the "
                "model: a checkpoint holds the model's parameters (and their optimizer state) "
                "only, so its values and state would be lost; make it a parameter of the model "
                "(register_parameter in its module) and build the optimizer over "
                "model->parameters()");
    out.push_back(it->second);
  }
  return out;
}

// The first name of `a` that `b` lacks, or "".
std::string first_missing(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(b.begin(), b.end());
  for (const auto& name : a) {
    if (!std::binary_search(b.begin(), b.end(), name)) return name;
  }
  return "";
}

}  // namespace

std::vector<ParamGroupMeta> describe_param_groups(const ShardedView& model, const OptimizerSet& optimizers,
                                                  const std::string& what, const std::set<const void*>& siblings) {
  const auto names = names_of_params(model);
  std::vector<ParamGroupMeta> groups;
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const auto& own = optimizers.optimizer(k).param_groups();
    for (size_t g = 0; g < own.size(); ++g) {
      groups.push_back(ParamGroupMeta{group_names(names, optimizers, k, g, what, siblings),
                                      options_to_json(own[g].options()), optimizers.state(k).name()});
    }
  }
  return groups;
}

StagedOptions stage_param_group_options(const std::vector<ParamGroupMeta>& saved, const ShardedView& model,
                                        const OptimizerSet& optimizers, const std::string& source,
                                        const std::set<const void*>& siblings) {
  const bool one = optimizers.size() == 1;
  size_t count = 0;
  for (size_t k = 0; k < optimizers.size(); ++k) count += optimizers.optimizer(k).param_groups().size();
  // Options restored into other groups would train their parameters at another group's rate.
  TORCH_CHECK(saved.size() == count, source, one ? ": the saved optimizer has " : ": the saved optimizers have ",
              saved.size(), " param group(s)", one ? "" : " in all", " but the program's ",
              one ? "has " : "have ", count, ": build the optimizer", one ? "" : "s",
              " with the param groups of the saved run (the same parameters in each, in the same order)");
  const auto names = names_of_params(model);
  StagedOptions staged(optimizers.size());
  size_t i = 0;  // the saved group of optimizer k's group g
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const std::string& name = optimizers.state(k).name();
    for (size_t g = 0; g < optimizers.optimizer(k).param_groups().size(); ++g, ++i) {
      TORCH_CHECK(saved[i].optimizer == name, source, ": param group ", i, " of the saved run is ",
                  saved[i].optimizer, "'s but the program's is ", name, "'s: pass the optimizers in "
                  "the saved run's order, each with the saved param groups");
      const auto mine = group_names(names, optimizers, k, g, source, siblings);
      const std::string only_saved = first_missing(saved[i].params, mine);
      const std::string only_mine = first_missing(mine, saved[i].params);
      TORCH_CHECK(only_saved.empty() && only_mine.empty(), source, ": param group ", i, " of the ",
                  only_saved.empty() ? "program's optimizer holds '" + only_mine + "', which the saved one's does not"
                                     : "saved optimizer holds '" + only_saved + "', which the program's does not",
                  ": build the optimizer", one ? "" : "s", " with the param groups of the saved run");
      staged[k].push_back(options_from_json(optimizers.optimizer(k).param_groups()[g].options(),
                                            saved[i].options, source));
    }
  }
  return staged;
}

void apply_param_group_options(const OptimizerSet& optimizers, StagedOptions& staged) {
  for (size_t k = 0; k < staged.size(); ++k) {
    auto& groups = optimizers.optimizer(k).param_groups();
    for (size_t g = 0; g < staged[k].size(); ++g) groups[g].set_options(std::move(staged[k][g]));
  }
}

}  // namespace fsdp::detail
