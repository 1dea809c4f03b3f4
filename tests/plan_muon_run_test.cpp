// The planner's Muon against the run it plans ([Note: Muon in the plan]): a model of three units
// of one matrix and a bias each (tall, wide, square; sizes no multiple of W) and a head in the
// root, stepped by fsdp::optim::Muon on split_for_muon's matrices and AdamW on the rest. The
// bytes Muon's all-to-alls send (comm_stats) on rank 0, its momentum there, and the
// Newton-Schulz flops of the busiest rank and of all ranks (Muon::last_step_work) are the plan's.
#include "dist_env.h"

#include <fsdp/fsdp.h>
#include <fsdp/muon.h>
#include <fsdp/plan.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace fsdp_test {
namespace {

struct PlannedNetImpl : torch::nn::Module {
  PlannedNetImpl() {
    tall = register_module("tall", torch::nn::Linear(20, 45));    // weight 45 x 20
    wide = register_module("wide", torch::nn::Linear(45, 19));    // 19 x 45
    square = register_module("square", torch::nn::Linear(19, 19));
    head = register_module("head", torch::nn::Linear(19, 3));
    tall_unit = tall;
    wide_unit = wide;
    square_unit = square;
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(square_unit(wide_unit(tall_unit(x)))); }
  torch::nn::Linear tall{nullptr}, wide{nullptr}, square{nullptr}, head{nullptr};
  fsdp::Unit<torch::nn::Linear> tall_unit, wide_unit, square_unit;
};
TORCH_MODULE(PlannedNet);

// The same model as the planner sees it: a unit per Linear, the head in the root.
fsdp::PlanModel planned_net() {
  auto linear = [](const std::string& name, int64_t in, int64_t out) {
    fsdp::PlanUnit unit;
    unit.name = name;
    unit.params = {{name + ".weight", {out, in}}, {name + ".bias", {out}}};
    return unit;
  };
  fsdp::PlanModel m;
  m.name = "planned net";
  m.root = linear("head", 19, 3);
  m.units = {linear("tall", 20, 45), linear("wide", 45, 19), linear("square", 19, 19)};
  m.sequence_tokens = 1;
  return m;
}

std::vector<double> from_every_rank(double value) {
  auto t = torch::zeros({dist().world_size()}, torch::kFloat64);
  t[dist().rank()] = value;
  fsdp::all_reduce_sum(*dist().world, t);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

TEST(PlannerMuon, PlannedExchangeMomentumAndFlopsAreTheRunsOnEveryWorld) {
  const int w = dist().world_size();
  torch::manual_seed(0);
  auto model = fsdp::fully_shard(PlannedNet(), *dist().world);
  const fsdp::optim::MuonSplit split = fsdp::optim::split_for_muon(*model);
  ASSERT_EQ(split.matrices.size(), 3u);
  fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
  torch::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(1e-3));
  torch::manual_seed(1 + dist().rank());
  model(torch::randn({4, 20})).pow(2).sum().backward();
  const int64_t before = fsdp::comm_stats().all_to_all_bytes;
  muon.step();
  const int64_t sent = fsdp::comm_stats().all_to_all_bytes - before;
  adamw.step();
  int64_t momentum = 0;
  for (const auto& [impl, state] : muon.state()) {
    const auto& s = static_cast<const fsdp::optim::MuonParamState&>(*state);
    momentum += s.momentum_buffer().numel() * s.momentum_buffer().element_size();
  }
  const std::vector<double> flops = from_every_rank(muon.last_step_work().flops);

  fsdp::PlanSetup setup;
  setup.model = planned_net();
  setup.world = {w, w};
  setup.policy.optimizer.name = "Muon";
  const fsdp::Plan plan = fsdp::plan(setup);
  EXPECT_EQ(plan.muon.matrices, 3);
  EXPECT_DOUBLE_EQ(*std::max_element(flops.begin(), flops.end()), plan.muon.busiest_flops);
  EXPECT_DOUBLE_EQ(std::accumulate(flops.begin(), flops.end(), 0.0), plan.muon.total_flops);
  if (dist().rank() == 0) {
    EXPECT_EQ(sent, plan.traffic.all_to_all);
    EXPECT_EQ(momentum, plan.muon.momentum_bytes);
  }
  if (w == 1) {
    EXPECT_EQ(sent, 0);
  }
}

}  // namespace
}  // namespace fsdp_test
