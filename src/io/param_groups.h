#pragma once
// The optimizer's param groups in a checkpoint: which parameters each group holds (by the model's
// names) and its options, saved so that a resumed run continues at the saved learning rate (an
// lr schedule's), and restored only into an optimizer grouped as the saved one was.

#include "io/checkpoint_format.h"
#include "core/sharded_view.h"

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdp::detail {

/// Each param group's parameters by name, and its options. Throws (`what`: the caller) naming the
/// group, the position and the shape of a tensor the optimizer holds that is not a parameter of
/// the model: a checkpoint holds the model's parameters only, so its state would be lost.
std::vector<ParamGroupMeta> describe_param_groups(const ShardedView& model,
                                                  torch::optim::Optimizer& optimizer,
                                                  const std::string& what);

/// The options each of the optimizer's param groups gets from `saved`: throws naming `source`
/// unless the optimizer has as many groups, each holding the same parameters.
std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> stage_param_group_options(
    const std::vector<ParamGroupMeta>& saved, const ShardedView& model,
    torch::optim::Optimizer& optimizer, const std::string& source);

/// Gives each param group its staged options (none staged: the groups keep theirs).
void apply_param_group_options(torch::optim::Optimizer& optimizer,
                               std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& staged);

}  // namespace fsdp::detail
