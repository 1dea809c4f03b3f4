// The planner's Muon against the run it plans ([Note: Muon in the plan]): a model of three units
// of one matrix and a bias each (tall, wide, square) and a head in the root, stepped by
// fsdp::optim::Muon on split_for_muon's matrices and AdamW on the rest. The bytes Muon's
// all-to-alls send (comm_stats) on rank 0, its momentum there, and the Newton-Schulz flops of the
// busiest rank and of all ranks (Muon::last_step_work) are the plan's; the highest rise of tensor
// memory during Muon's step (the counting allocator) is the plan's workspace within 5% (measured:
// equal at W = 1 and 2, 4.0% above at W = 3). The matrices are large enough that what the plan
// leaves out (a piece's fp32 temporaries, a scalar norm) is small beside them. The same on a 2-D
// model (FSDP x TP at (dp, tp) = (1, 2) and (2, 2)): split and replicated matrices, every rank's
// bytes and flops, and the workspace the run records ([Note: Muon's step in phases]) against the
// plan's, and both against the memory the step really took.
#include "dist_env.h"

#include <fsdp/fsdp.h>
#include <fsdp/muon.h>
#include <fsdp/plan.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace fsdp_test {
namespace {

struct PlannedNetImpl : torch::nn::Module {
  PlannedNetImpl() {
    tall = register_module("tall", torch::nn::Linear(160, 360));    // weight 45 x 20
    wide = register_module("wide", torch::nn::Linear(360, 152));    // 19 x 45
    square = register_module("square", torch::nn::Linear(152, 152));
    head = register_module("head", torch::nn::Linear(152, 3));
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
  m.root = linear("head", 152, 3);
  m.units = {linear("tall", 160, 360), linear("wide", 360, 152), linear("square", 152, 152)};
  m.sequence_tokens = 1;
  return m;
}

std::vector<double> from_every_rank(double value) {
  auto t = torch::zeros({dist().world_size()}, torch::kFloat64);
  t[dist().rank()] = value;
  fsdp::all_reduce_sum(*dist().world, t);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

// Muon's second step on `model` (the first makes the momentum): the all-to-all bytes this rank
// sent and the highest rise of its tensor memory during the step.
struct MeasuredStep {
  int64_t sent = 0;
  double rise = 0;
};
template <typename Model>
MeasuredStep measure_second_step(Model& model, fsdp::optim::Muon& muon, torch::optim::AdamW& adamw, int64_t width) {
  auto backward = [&] {
    muon.zero_grad();
    adamw.zero_grad();
    model(torch::randn({4, width})).pow(2).sum().backward();
  };
  backward();
  muon.step();
  adamw.step();
  backward();
  const int64_t before = fsdp::comm_stats().all_to_all_bytes;
  fsdp::reset_peak_memory();
  const int64_t held = fsdp::memory_stats().current_bytes;
  muon.step();
  MeasuredStep measured{fsdp::comm_stats().all_to_all_bytes - before,
                        static_cast<double>(fsdp::memory_stats().peak_bytes - held)};
  adamw.step();
  return measured;
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
  const MeasuredStep step = measure_second_step(model, muon, adamw, 160);
  const int64_t sent = step.sent;
  const std::vector<double> rises = from_every_rank(step.rise);
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
  // The step's transient: the exchange's buffers, the wholes, the results, the iteration.
  const double rise = *std::max_element(rises.begin(), rises.end());
  if (dist().rank() == 0) {
    std::printf("W = %d: Muon's step rose %.0f bytes at most, planned %lld (%s)\n", w, rise,
                static_cast<long long>(plan.muon.workspace), plan.muon.workspace_at.c_str());
  }
  EXPECT_NEAR(rise, static_cast<double>(plan.muon.workspace), 0.05 * static_cast<double>(plan.muon.workspace));
  // Every rank sends what the plan gives it (the owners' shares are uneven: the mean is not rank 0's).
  EXPECT_EQ(sent, plan.muon.all_to_all_by_rank.at(dist().rank()));
  const std::vector<double> sent_by_rank = from_every_rank(static_cast<double>(sent));
  EXPECT_DOUBLE_EQ(*std::max_element(sent_by_rank.begin(), sent_by_rank.end()), plan.muon.all_to_all_busiest);
  EXPECT_DOUBLE_EQ(std::accumulate(sent_by_rank.begin(), sent_by_rank.end(), 0.0) / w, plan.muon.all_to_all_mean);
  if (dist().rank() == 0) {
    EXPECT_EQ(momentum, plan.muon.momentum_bytes);
  }
  if (w == 1) {
    EXPECT_EQ(sent, 0);
  }
}

// A block of a user's 2-D model: a column-wise up, a row-wise down (split), and a mixing matrix
// the plan leaves replicated.
struct SplitBlockImpl : torch::nn::Module {
  SplitBlockImpl(int64_t dim, int64_t hidden)
      : up(register_module("up", torch::nn::Linear(dim, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, dim))),
        mix(register_module("mix", torch::nn::Linear(dim, dim))) {}
  torch::Tensor forward(const torch::Tensor& x) { return mix(x + down(torch::relu(up(x)))); }
  fsdp::tp::Parallel<torch::nn::Linear> up, down;
  torch::nn::Linear mix;
};
TORCH_MODULE(SplitBlock);

struct SplitNetImpl : torch::nn::Module {
  SplitNetImpl() {
    auto list = register_module("blocks", torch::nn::ModuleList());
    list->push_back(SplitBlock(kDim, 416));
    list->push_back(SplitBlock(kDim, 200));
    blocks = fsdp::wrap_blocks<SplitBlock>(list);
    head = register_module("head", torch::nn::Linear(kDim, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block(x);
    return head(x);
  }
  static constexpr int64_t kDim = 144;
  std::vector<fsdp::Unit<SplitBlock>> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(SplitNet);

// The planner's view of SplitNet at --tp `t`: each rank's parts, the dimension split.
fsdp::PlanModel planned_split_net(int64_t t) {
  const int64_t c = SplitNetImpl::kDim;
  auto block = [&](int i, int64_t hidden) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    fsdp::PlanUnit unit;
    unit.name = "blocks." + std::to_string(i);
    unit.params = {{b + "up.weight", {hidden / t, c}}, {b + "up.bias", {hidden / t}},
                   {b + "down.weight", {c, hidden / t}}, {b + "down.bias", {c}},
                   {b + "mix.weight", {c, c}}, {b + "mix.bias", {c}}};
    unit.params[0].tp_dim = 0;
    unit.params[1].tp_dim = 0;
    unit.params[2].tp_dim = 1;
    return unit;
  };
  fsdp::PlanModel m;
  m.name = "split net";
  m.root.params = {{"head.weight", {3, c}}, {"head.bias", {3}}};
  m.units = {block(0, 416), block(1, 200)};
  m.sequence_tokens = 1;
  m.tp_size = static_cast<int>(t);
  return m;
}

TEST(PlannerMuon, TensorParallelExchangeFlopsAndWorkspaceAreTheRunsOnEveryRank) {
  const int w = dist().world_size(), t = 2;
  if (w != 2 && w != 4) GTEST_SKIP() << "(dp, tp) = (1, 2) at W = 2 and (2, 2) at W = 4";
  fsdp::DeviceMesh mesh(dist().world, {{"dp", w / t}, {"tp", t}});
  auto tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  torch::manual_seed(0);
  SplitNet net;
  fsdp::tp::parallelize_module(*net, tp, {{"blocks.*.up", fsdp::tp::ColwiseParallel()},
                                          {"blocks.*.down", fsdp::tp::RowwiseParallel()}});
  auto model = fsdp::fully_shard(net, mesh.group("dp"));
  const fsdp::optim::MuonSplit split = fsdp::optim::split_for_muon(*model);
  ASSERT_EQ(split.matrices.size(), 6u);
  fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
  torch::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(1e-3));
  torch::manual_seed(1 + mesh.coordinate("dp"));  // each tp rank of a dp rank: the same batch
  const MeasuredStep step = measure_second_step(model, muon, adamw, SplitNetImpl::kDim);
  const double rise = step.rise;
  const int64_t sent = step.sent;
  const fsdp::optim::MuonWork work = muon.last_step_work();

  fsdp::PlanSetup setup;
  setup.model = planned_split_net(t);
  setup.world = {w, w};
  setup.policy.tp_size = t;
  setup.policy.optimizer.name = "Muon";
  const fsdp::Plan plan = fsdp::plan(setup);
  EXPECT_EQ(plan.muon.matrices, 6);
  EXPECT_EQ(sent, plan.muon.all_to_all_by_rank.at(dist().rank()));
  const std::vector<double> flops = from_every_rank(work.flops);
  EXPECT_DOUBLE_EQ(*std::max_element(flops.begin(), flops.end()), plan.muon.busiest_flops);
  EXPECT_DOUBLE_EQ(std::accumulate(flops.begin(), flops.end(), 0.0), plan.muon.total_flops * (w / t) /
                                                                         plan.shard_group_size);
  // The run's own count of its workspace is the plan's (the same phases over the same shares),
  // and the memory the step took is that count.
  const std::vector<double> recorded = from_every_rank(static_cast<double>(work.workspace_bytes));
  const std::vector<double> rises = from_every_rank(rise);
  const auto top = std::max_element(recorded.begin(), recorded.end());
  EXPECT_EQ(*top, static_cast<double>(plan.muon.workspace));
  EXPECT_EQ(top - recorded.begin(), plan.muon.workspace_rank);
  for (int r = 0; r < w; ++r) {
    if (dist().rank() == 0) {
      std::printf("W = %d rank %d: Muon's step rose %.0f bytes, recorded %.0f; sent %lld\n", w, r, rises[r],
                  recorded[r], static_cast<long long>(plan.muon.all_to_all_by_rank.at(r)));
    }
    EXPECT_NEAR(rises[r], recorded[r], 0.1 * recorded[r]) << "rank " << r;
  }
}

}  // namespace
}  // namespace fsdp_test
