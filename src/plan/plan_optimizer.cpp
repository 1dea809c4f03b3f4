#include "plan/plan_optimizer.h"

#include "optim/optimizer_kinds.h"
#include "plan/plan_muon.h"

#include <c10/util/Exception.h>

namespace fsdp::planning {

namespace {

// An option set on an optimizer without it would be planned as if absent: refused instead.
void check_has_option(const optimizers::OptimizerKind& kind, bool set, optimizers::AddedBy option,
                      const char* option_name) {
  TORCH_CHECK(!set || optimizers::has_option(kind, option), "plan: the optimizer ", kind.name, " has no ",
              option_name, " option (PlanPolicy::optimizer.", option_name, "); unset it");
}

OptimizerBytes kind_bytes(const optimizers::OptimizerKind& kind, const optimizers::StateOptions& options,
                        int64_t element_bytes) {
  return {optimizers::state_bytes_per_element(kind, options, element_bytes),
          optimizers::step_bytes_per_element(kind, options, element_bytes)};
}

// What steps the rest of a Muon plan: AdamW as gpt_train builds it (no amsgrad).
OptimizerBytes muon_plan_rest_bytes(int64_t element_bytes) {
  return kind_bytes(*optimizers::find_optimizer("AdamW"), {}, element_bytes);
}

}  // namespace

OptimizerBytes optimizer_bytes(const PlanOptimizer& optimizer, int64_t element_bytes) {
  const optimizers::OptimizerKind* kind = optimizers::find_optimizer(optimizer.name);
  TORCH_CHECK(kind, "plan: unknown optimizer '", optimizer.name, "' (PlanPolicy::optimizer.name): the planner knows ",
              optimizers::known_optimizer_names(), " (fsdp::optim's AdamW and SGD are those; Muon is "
              "fsdp::optim::Muon on the hidden matrices and AdamW on the rest)");
  check_has_option(*kind, optimizer.amsgrad, optimizers::AddedBy::Amsgrad, "amsgrad");
  check_has_option(*kind, optimizer.momentum, optimizers::AddedBy::Momentum, "momentum");
  check_has_option(*kind, optimizer.centered, optimizers::AddedBy::Centered, "centered");
  TORCH_CHECK(!plans_muon(optimizer) || optimizer.ns_steps >= 1, "plan: Muon's ns_steps (PlanPolicy::optimizer."
              "ns_steps) must be >= 1, got ", optimizer.ns_steps);
  optimizers::StateOptions options;
  options.amsgrad = optimizer.amsgrad;
  options.momentum = optimizer.momentum;
  options.centered = optimizer.centered;
  return kind_bytes(*kind, options, element_bytes);
}

OptimizerTotals optimizer_totals(const PlanOptimizer& optimizer, int64_t piece_numel, int64_t muon_numel,
                                 int64_t element_bytes) {
  const OptimizerBytes own = optimizer_bytes(optimizer, element_bytes);
  if (!plans_muon(optimizer)) return {piece_numel * own.state_per_element, piece_numel * own.step_per_element};
  const OptimizerBytes rest = muon_plan_rest_bytes(element_bytes);
  const int64_t others = piece_numel - muon_numel;
  return {muon_numel * own.state_per_element + others * rest.state_per_element,
          muon_numel * own.step_per_element + others * rest.step_per_element};
}

}  // namespace fsdp::planning
