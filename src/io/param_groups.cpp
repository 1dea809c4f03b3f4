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

// The names of group `g`'s parameters; throws at a tensor that is not one of the model's.
std::vector<std::string> group_names(const std::map<const void*, std::string>& names, Optimizer& optimizer,
                                     size_t g, const std::string& what) {
  std::vector<std::string> out;
  const auto& params = optimizer.param_groups()[g].params();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = names.find(params[i].unsafeGetTensorImpl());
    TORCH_CHECK(it != names.end(), what, ": the optimizer's param group ", g, " holds, at position ",
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

std::vector<ParamGroupMeta> describe_param_groups(const ShardedView& model, Optimizer& optimizer,
                                                  const std::string& what) {
  const auto names = names_of_params(model);
  std::vector<ParamGroupMeta> groups;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    groups.push_back(ParamGroupMeta{group_names(names, optimizer, g, what),
                                    options_to_json(optimizer.param_groups()[g].options())});
  }
  return groups;
}

std::vector<std::unique_ptr<OptimizerOptions>> stage_param_group_options(
    const std::vector<ParamGroupMeta>& saved, const ShardedView& model, Optimizer& optimizer,
    const std::string& source) {
  const size_t count = optimizer.param_groups().size();
  // Options restored into other groups would train their parameters at another group's rate.
  TORCH_CHECK(saved.size() == count, source, ": the saved optimizer has ", saved.size(),
              " param group(s) but the program's has ", count, ": build the optimizer with the "
              "param groups of the saved run (the same parameters in each, in the same order)");
  const auto names = names_of_params(model);
  std::vector<std::unique_ptr<OptimizerOptions>> staged;
  for (size_t g = 0; g < count; ++g) {
    const auto mine = group_names(names, optimizer, g, source);
    const std::string only_saved = first_missing(saved[g].params, mine);
    const std::string only_mine = first_missing(mine, saved[g].params);
    TORCH_CHECK(only_saved.empty() && only_mine.empty(), source, ": param group ", g, " of the ",
                only_saved.empty() ? "program's optimizer holds '" + only_mine + "', which the saved one's does not"
                                   : "saved optimizer holds '" + only_saved + "', which the program's does not",
                ": build the optimizer with the param groups of the saved run");
    staged.push_back(options_from_json(optimizer.param_groups()[g].options(), saved[g].options, source));
  }
  return staged;
}

void apply_param_group_options(Optimizer& optimizer, std::vector<std::unique_ptr<OptimizerOptions>>& staged) {
  for (size_t g = 0; g < staged.size(); ++g) optimizer.param_groups()[g].set_options(std::move(staged[g]));
}

}  // namespace fsdp::detail
