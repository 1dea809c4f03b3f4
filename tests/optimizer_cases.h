#pragma once
// Each optimizer a program may build, with what optim/optimizer_kinds.h says it keeps: every
// torch::optim class the checkpoints know and fsdp::optim's fused ones, with and without each
// option that adds state ([Note: what an optimizer keeps, once]).

#include "optim/optimizer_kinds.h"

#include <fsdp/fused_adamw.h>
#include <fsdp/fused_sgd.h>
#include <fsdp/muon.h>

#include <torch/optim.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp_test {

using fsdp::optimizers::StateOptions;

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// One optimizer as a program builds it, and what the description says it keeps.
struct OptimizerCase {
  std::string label;
  std::string described_as;
  StateOptions options;
  MakeOptimizer make;
  bool matrices_only = false;  // steps 2-D parameters only (Muon)
};

inline StateOptions with(bool amsgrad, bool momentum, bool centered) {
  StateOptions s;
  s.amsgrad = amsgrad;
  s.momentum = momentum;
  s.centered = centered;
  return s;
}

template <class O, class Options>
MakeOptimizer maker(Options options) {
  return [options](std::vector<at::Tensor> params) { return std::make_unique<O>(params, options); };
}

inline std::vector<OptimizerCase> optimizer_cases() {
  namespace o = torch::optim;
  const StateOptions none;
  return {
      {"SGD", "SGD", none, maker<o::SGD>(o::SGDOptions(0.1))},
      {"SGD with momentum", "SGD", with(false, true, false), maker<o::SGD>(o::SGDOptions(0.1).momentum(0.9))},
      {"fsdp::optim::SGD", "SGD", none, maker<fsdp::optim::SGD>(o::SGDOptions(0.1))},
      {"fsdp::optim::SGD with momentum", "SGD", with(false, true, false),
       maker<fsdp::optim::SGD>(o::SGDOptions(0.1).momentum(0.9))},
      {"Adam", "Adam", none, maker<o::Adam>(o::AdamOptions(0.01))},
      {"Adam with amsgrad", "Adam", with(true, false, false), maker<o::Adam>(o::AdamOptions(0.01).amsgrad(true))},
      {"AdamW", "AdamW", none, maker<o::AdamW>(o::AdamWOptions(0.01))},
      {"AdamW with amsgrad", "AdamW", with(true, false, false),
       maker<o::AdamW>(o::AdamWOptions(0.01).amsgrad(true))},
      {"fsdp::optim::AdamW", "AdamW", none, maker<fsdp::optim::AdamW>(o::AdamWOptions(0.01))},
      {"fsdp::optim::AdamW with amsgrad", "AdamW", with(true, false, false),
       maker<fsdp::optim::AdamW>(o::AdamWOptions(0.01).amsgrad(true))},
      {"RMSprop", "RMSprop", none, maker<o::RMSprop>(o::RMSpropOptions(0.01))},
      {"RMSprop with momentum", "RMSprop", with(false, true, false),
       maker<o::RMSprop>(o::RMSpropOptions(0.01).momentum(0.5))},
      {"centered RMSprop with momentum", "RMSprop", with(false, true, true),
       maker<o::RMSprop>(o::RMSpropOptions(0.01).momentum(0.5).centered(true))},
      {"Adagrad", "Adagrad", none, maker<o::Adagrad>(o::AdagradOptions(0.1))},
      {"fsdp::optim::Muon", "Muon", none, maker<fsdp::optim::Muon>(fsdp::optim::MuonOptions(0.02)), true},
  };
}

}  // namespace fsdp_test
