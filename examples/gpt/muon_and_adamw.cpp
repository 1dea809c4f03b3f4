#include "muon_and_adamw.h"

#include <c10/util/Exception.h>

#include <memory>

namespace gpt {

namespace {

// Both optimizers' param groups: the same parameters, copies of their options.
std::vector<torch::optim::OptimizerParamGroup> groups_of(torch::optim::Optimizer& a,
                                                         torch::optim::Optimizer& b) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (torch::optim::Optimizer* optimizer : {&a, &b}) {
    for (const auto& group : optimizer->param_groups()) groups.emplace_back(group);
  }
  return groups;
}

}  // namespace

MuonAndAdamW::MuonAndAdamW(fsdp::optim::Muon& muon, fsdp::optim::AdamW& adamw)
    : torch::optim::Optimizer(groups_of(adamw, muon), adamw.defaults().clone()),
      muon_(muon),
      adamw_(adamw) {}

MuonAndAdamW::~MuonAndAdamW() { finish_queued_steps(); }

torch::Tensor MuonAndAdamW::step(LossClosure closure) {
  TORCH_CHECK(!closure, "gpt::MuonAndAdamW::step takes no closure (neither gpt_train's step does)");
  wait_queued_steps();  // the units queued by StepInBackward were queued here, not on either
  adamw_.step();
  muon_.step();
  return {};
}

void MuonAndAdamW::step_parameters(const std::vector<at::Tensor>& params,
                                   const std::vector<at::Tensor>& grads) {
  // Each optimizer steps the parameters of its own groups among these and marks all of them
  // stepped, so that its step() skips them.
  adamw_.step_parameters(params, grads);
  muon_.step_parameters(params, grads);
}

}  // namespace gpt
