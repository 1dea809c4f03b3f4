#pragma once
// The optimizers' param groups in a checkpoint: which parameters each group holds (by the model's
// names), its options and (several optimizers) its optimizer's class, saved so that a resumed
// run continues at the saved learning rate (an lr schedule's), and restored only into optimizers
// grouped as the saved ones were ([Note: several optimizers, one checkpoint]).

#include "io/checkpoint_format.h"
#include "io/optimizer_set.h"
#include "core/sharded_view.h"

#include <torch/optim/optimizer.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace fsdp::detail {

/// Every optimizer's param groups, in order: each group's parameters by name, its options and
/// its optimizer's class. Throws (`what`: the caller) naming the group, the position and the
/// shape of a tensor an optimizer holds that is not a parameter of the model: a checkpoint holds
/// the model's parameters only, so its state would be lost. `siblings`: the parameters of this
/// rank's other pipeline stages, left out (their own stage describes them).
std::vector<ParamGroupMeta> describe_param_groups(const ShardedView& model, const OptimizerSet& optimizers,
                                                  const std::string& what,
                                                  const std::set<const void*>& siblings = {});

/// The options each optimizer's param groups get from `saved`: throws naming `source` unless the
/// optimizers have as many groups in all, each of the saved class and holding the same parameters
/// (of the model: `siblings` left out, as describe_param_groups does).
StagedOptions stage_param_group_options(const std::vector<ParamGroupMeta>& saved, const ShardedView& model,
                                        const OptimizerSet& optimizers, const std::string& source,
                                        const std::set<const void*>& siblings = {});

/// Gives each param group its staged options (none staged: the groups keep theirs).
void apply_param_group_options(const OptimizerSet& optimizers, StagedOptions& staged);

}  // namespace fsdp::detail
