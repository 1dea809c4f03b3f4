#include "plan/plan_optimizer.h"

#include "optim/optimizer_kinds.h"

#include <c10/util/Exception.h>

namespace fsdp::planning {

namespace {

// An option set on an optimizer without it would be planned as if absent: refused instead.
void check_has_option(const optimizers::OptimizerKind& kind, bool set, optimizers::AddedBy option,
                      const char* option_name) {
  TORCH_CHECK(!set || optimizers::has_option(kind, option), "plan: the optimizer ", kind.name, " has no ",
              option_name, " option (PlanPolicy::optimizer.", option_name, "); unset it");
}

}  // namespace

OptimizerBytes optimizer_bytes(const PlanOptimizer& optimizer, int64_t element_bytes) {
  const optimizers::OptimizerKind* kind = optimizers::find_optimizer(optimizer.name);
  TORCH_CHECK(kind, "plan: unknown optimizer '", optimizer.name, "' (PlanPolicy::optimizer.name): the planner knows ",
              optimizers::known_optimizer_names(), " (fsdp::optim's AdamW and SGD are those)");
  check_has_option(*kind, optimizer.amsgrad, optimizers::AddedBy::Amsgrad, "amsgrad");
  check_has_option(*kind, optimizer.momentum, optimizers::AddedBy::Momentum, "momentum");
  check_has_option(*kind, optimizer.centered, optimizers::AddedBy::Centered, "centered");
  optimizers::StateOptions options;
  options.amsgrad = optimizer.amsgrad;
  options.momentum = optimizer.momentum;
  options.centered = optimizer.centered;
  return {optimizers::state_bytes_per_element(*kind, options, element_bytes),
          optimizers::step_bytes_per_element(*kind, options, element_bytes)};
}

}  // namespace fsdp::planning
