// What an optimizer keeps, described once (src/optim/optimizer_kinds.h), against its two readers:
// each torch::optim and fsdp::optim optimizer, stepped for real, holds exactly the described state
// tensors (in its parameter's shape and dtype) as the checkpoints' table reads them; and the
// planner's optimizer state and step time for SGD and AdamW differ by the described bytes.
#include "error_of.h"
#include "io/optimizer_state.h"
#include "optimizer_cases.h"

#include <fsdp/plan.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

namespace fsdp_test {
namespace {

using fsdp::optimizers::AddedBy;
using fsdp::optimizers::StateOptions;

bool sets(const StateOptions& s, AddedBy option) {
  return option == AddedBy::Always || (option == AddedBy::Amsgrad && s.amsgrad) ||
         (option == AddedBy::Momentum && s.momentum) || (option == AddedBy::Centered && s.centered);
}

TEST(OptimizerKinds, TheCasesCoverEveryDescribedOptimizerAndOption) {
  for (const auto& kind : fsdp::optimizers::known_optimizers()) {
    for (const auto& tensor : kind.tensors) {
      bool covered = false;
      for (const auto& c : optimizer_cases()) covered |= c.described_as == kind.name && sets(c.options, tensor.added_by);
      EXPECT_TRUE(covered) << kind.name << "'s " << tensor.kind << ": no case keeps it";
    }
  }
}

// Each optimizer, stepped twice on a float matrix and a double vector, holds for each parameter
// exactly the kinds described (SGD without momentum: no state at all), each in the parameter's shape and dtype, and a step count iff it
// counts steps; the checkpoints' table (io/optimizer_state.cpp) names and lists the same.
TEST(OptimizerKinds, TheCheckpointsTableReadsExactlyTheDescribedStateOfEveryOptimizer) {
  for (const auto& c : optimizer_cases()) {
    SCOPED_TRACE(c.label);
    const auto* kind = fsdp::optimizers::find_optimizer(c.described_as);
    ASSERT_NE(kind, nullptr);
    const std::vector<std::string> described = fsdp::optimizers::kinds_kept(*kind, c.options);
    torch::manual_seed(3);
    std::vector<at::Tensor> params{torch::randn({3, 4}).requires_grad_(),
                                   torch::randn({5}, torch::kDouble).requires_grad_()};
    if (c.matrices_only) params.pop_back();
    auto optimizer = c.make(params);
    for (int step = 0; step < 2; ++step) {
      optimizer->zero_grad();
      auto loss = params[0].sum() * 2;
      if (params.size() > 1) loss = loss + params[1].pow(2).sum();
      loss.backward();
      optimizer->step();
    }
    const fsdp::detail::OptimizerState table(*optimizer, "the test");
    EXPECT_EQ(table.name(), kind->name);
    EXPECT_EQ(table.counts_steps(), kind->counts_steps);
    EXPECT_EQ(table.kinds_in_use(), described);
    for (const auto& p : params) {
      EXPECT_EQ(table.kinds_needed(p), std::optional<std::vector<std::string>>(described));
      const auto state = table.read(p);
      if (!state) {  // an optimizer that keeps nothing may hold no entry (SGD without momentum)
        EXPECT_TRUE(described.empty() && !kind->counts_steps);
        continue;
      }
      std::set<std::string> held;
      for (const auto& [name, tensor] : state->tensors) {
        held.insert(name);
        EXPECT_EQ(tensor.sizes(), p.sizes()) << name;
        EXPECT_EQ(tensor.scalar_type(), p.scalar_type()) << name;
      }
      EXPECT_EQ(held, std::set<std::string>(described.begin(), described.end()));
      EXPECT_EQ(state->step.has_value(), kind->counts_steps);
      if (kind->counts_steps) {
        EXPECT_EQ(*state->step, 2);
      }
    }
  }
}

// A model of a root and three units, each unit's parameters divisible by W = 2 (no padding).
fsdp::PlanSetup two_rank_setup() {
  auto unit = [](const std::string& name, std::vector<int64_t> shape) {
    fsdp::PlanUnit u;
    u.name = name;
    u.params = {{name + ".weight", std::move(shape)}};
    u.forward_flops = 1e6;
    u.forward_memory_bytes = 1e5;
    return u;
  };
  fsdp::PlanSetup setup;
  setup.model.name = "blocks";
  setup.model.root = unit("head", {64, 32});
  for (int i = 0; i < 3; ++i) setup.model.units.push_back(unit("block." + std::to_string(i), {32, 32}));
  setup.model.sequence_tokens = 16;
  setup.world = {2, 2};
  setup.device.fp32 = {1e12, 1e12, 1e11, 1e10};
  setup.links = {1e10, 1e9, 1e-5};
  return setup;
}

fsdp::Plan plan_with(fsdp::PlanOptimizer optimizer) {
  fsdp::PlanSetup setup = two_rank_setup();
  setup.policy.optimizer = std::move(optimizer);
  return fsdp::plan(setup);
}

TEST(OptimizerKinds, PlannedSgdAndAdamWDifferByTheDescribedStateAndStepBytes) {
  fsdp::PlanOptimizer sgd;
  sgd.name = "SGD";
  const fsdp::Plan with_sgd = plan_with(sgd);
  const fsdp::Plan with_adamw = plan_with(fsdp::PlanOptimizer{});  // the default
  EXPECT_EQ(with_adamw.setup.policy.optimizer.name, "AdamW");
  const int64_t piece_elements = with_sgd.setup.model.numel() / 2;  // each rank's half, no padding
  const auto& adamw = *fsdp::optimizers::find_optimizer("AdamW");
  const auto& plain_sgd = *fsdp::optimizers::find_optimizer("SGD");
  const int64_t state_difference = piece_elements * (fsdp::optimizers::state_bytes_per_element(adamw, {}, 4) -
                                                     fsdp::optimizers::state_bytes_per_element(plain_sgd, {}, 4));
  EXPECT_EQ(state_difference, piece_elements * 8);  // AdamW's exp_avg and exp_avg_sq in fp32
  ASSERT_EQ(with_sgd.ranks.size(), with_adamw.ranks.size());
  for (size_t r = 0; r < with_sgd.ranks.size(); ++r) {
    EXPECT_EQ(with_sgd.ranks[r].peak.optimizer_state, 0) << "rank " << r;
    EXPECT_EQ(with_adamw.ranks[r].peak.optimizer_state, state_difference) << "rank " << r;
    EXPECT_EQ(with_adamw.ranks[r].model_states - with_sgd.ranks[r].model_states, state_difference) << "rank " << r;
  }
  // The step's pass over the pieces: AdamW moves 7 elements' worth, SGD 3.
  const int64_t step_difference = piece_elements * (fsdp::optimizers::step_bytes_per_element(adamw, {}, 4) -
                                                    fsdp::optimizers::step_bytes_per_element(plain_sgd, {}, 4));
  EXPECT_EQ(step_difference, piece_elements * 16);
  const double step_seconds = static_cast<double>(step_difference) / two_rank_setup().device.fp32.memory_bandwidth;
  EXPECT_GT(step_seconds, 0);
  EXPECT_NEAR(with_adamw.time.compute - with_sgd.time.compute, step_seconds, 1e-9 * step_seconds);
}

TEST(OptimizerKinds, PlanningAnUnknownOptimizerOrAnOptionItLacksIsAnError) {
  fsdp::PlanOptimizer lbfgs;
  lbfgs.name = "LBFGS";
  const std::string unknown = error_of([&] { plan_with(lbfgs); });
  EXPECT_NE(unknown.find("unknown optimizer 'LBFGS'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("SGD, Adam, AdamW, RMSprop, Adagrad and Muon"), std::string::npos) << unknown;
  fsdp::PlanOptimizer sgd_amsgrad;
  sgd_amsgrad.name = "SGD";
  sgd_amsgrad.amsgrad = true;
  const std::string lacking = error_of([&] { plan_with(sgd_amsgrad); });
  EXPECT_NE(lacking.find("SGD has no amsgrad option"), std::string::npos) << lacking;
}

}  // namespace
}  // namespace fsdp_test
