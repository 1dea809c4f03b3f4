// Sharded checkpoints carry the whole training state, whatever the optimizer: a model with
// BatchNorm trained by each of torch::optim's SGD (momentum), Adam, AdamW, RMSprop and Adagrad,
// saved by W - 1 ranks (a subgroup of this job) and resumed by all W, ends where the unsharded
// program that was never interrupted ends, within fp32 rounding: parameters, running
// statistics, num_batches_tracked. Every rank trains on the same batch, so BatchNorm's
// statistics, and so the run, do not depend on the world size; the unsharded program is each
// rank's own plain LibTorch model. The full state dict holds the buffers, and an optimizer whose
// state is unknown is refused by name at the first save. What each optimizer saves is what
// src/optim/optimizer_kinds.h describes, no more, no less.
#include "dist_env.h"
#include "shared_folder.h"
#include "optimizer_cases.h"
#include "test_models.h"

#include <fsdp/checkpoint.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <unistd.h>

namespace fsdp_test {
namespace {

namespace nn = torch::nn;
namespace fs = std::filesystem;

using Net = BatchNormNet;

constexpr int kStateSteps = 6;
constexpr int kSavedAt = 3;

Net fresh_net() {
  torch::manual_seed(11);
  return Net();
}

std::pair<torch::Tensor, torch::Tensor> batch(int step) {  // the same on every rank
  auto gen = at::detail::createCPUGenerator(500 + step);
  return {torch::randn({8, 5}, gen), torch::randn({8, 3}, gen)};
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

void train(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
           torch::optim::Optimizer& optimizer, int first, int last) {
  for (int step = first; step < last; ++step) {
    auto [x, y] = batch(step);
    optimizer.zero_grad();
    torch::mse_loss(forward(x), y).backward();
    optimizer.step();
  }
}

std::map<std::string, torch::Tensor> state_of(nn::Module& net) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : net.named_parameters()) out[item.key()] = item.value().detach().clone();
  for (const auto& item : net.named_buffers()) out[item.key()] = item.value().detach().clone();
  return out;
}

// The unsharded program's final state, then: W - 1 ranks train to kSavedAt and save, all W load
// and train to kStateSteps; the full state dict must match the unsharded one.
void expect_resume_equals_uninterrupted(const std::string& name, const MakeOptimizer& make) {
  const int world = dist().world_size();
  if (world < 2) GTEST_SKIP() << "one rank: no other world size to resume at";
  Net reference = fresh_net();
  auto reference_optimizer = make(reference->parameters());
  train([&](const torch::Tensor& x) { return reference->forward(x); }, *reference_optimizer, 0, kStateSteps);
  const auto expected = state_of(*reference);

  const std::string folder = shared_folder("checkpoint-state", name);
  std::vector<int> savers(world - 1);
  for (int r = 0; r < world - 1; ++r) savers[r] = r;
  if (dist().rank() < world - 1) {
    auto group = dist().world->subgroup(savers, "savers-" + name);
    auto model = fsdp::fully_shard(fresh_net(), *group);
    auto optimizer = make(model->parameters());
    train([&](const torch::Tensor& x) { return model(x); }, *optimizer, 0, kSavedAt);
    fsdp::save_sharded(model, *optimizer, folder, {{"step", kSavedAt}});
  }
  barrier();

  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto optimizer = make(model->parameters());
  EXPECT_EQ(fsdp::load_sharded(model, *optimizer, folder).at("step").get<int>(), kSavedAt);
  EXPECT_EQ(model->block->bn->num_batches_tracked.item<int64_t>(), kSavedAt);
  train([&](const torch::Tensor& x) { return model(x); }, *optimizer, kSavedAt, kStateSteps);

  const auto full = fsdp::gather_full_params(model);
  EXPECT_EQ(full.size(), expected.size()) << "the full state dict: every parameter and buffer";
  double worst = 0;
  for (const auto& [key, tensor] : full) {
    ASSERT_TRUE(expected.count(key)) << key;
    const auto& want = expected.at(key);
    const double diff = (tensor.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>() /
                        std::max(want.to(torch::kDouble).abs().max().item<double>(), 1e-12);
    EXPECT_LE(diff, 1e-5) << name << ": " << key;
    worst = std::max(worst, diff);
  }
  if (dist().rank() == 0) {
    std::printf("[%s] saved at W=%d, resumed at W=%d: max relative difference %.3g\n",
                name.c_str(), world - 1, world, worst);
  }
  barrier();
  if (dist().rank() == 0) fs::remove_all(folder);
}

TEST(CheckpointState, SgdWithMomentumResumesAtAnotherWorldSize) {
  expect_resume_equals_uninterrupted("sgd", [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  });
}

TEST(CheckpointState, AdamResumesAtAnotherWorldSize) {
  expect_resume_equals_uninterrupted("adam", [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  });
}

TEST(CheckpointState, AdamWWithAmsgradResumesAtAnotherWorldSize) {
  expect_resume_equals_uninterrupted("adamw", [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).amsgrad(true));
  });
}

TEST(CheckpointState, CenteredRmspropWithMomentumResumesAtAnotherWorldSize) {
  expect_resume_equals_uninterrupted("rmsprop", [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::RMSprop>(
        p, torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
  });
}

TEST(CheckpointState, AdagradResumesAtAnotherWorldSize) {
  expect_resume_equals_uninterrupted("adagrad", [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1));
  });
}

TEST(CheckpointState, AnUnknownOptimizerIsRefusedByNameAtTheFirstSave) {
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  torch::optim::LBFGS optimizer(model->parameters());
  try {
    fsdp::save_sharded(model, optimizer, shared_folder("checkpoint-state", "lbfgs"));
    FAIL() << "saved an LBFGS";
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    EXPECT_NE(text.find("LBFGS"), std::string::npos) << text;
    EXPECT_NE(text.find("SGD, Adam, AdamW, RMSprop"), std::string::npos) << text;
  }
  barrier();
}


// Every optimizer (tests/optimizer_cases.h), one step on the sharded model, then saved: its
// metadata.json lists for each parameter exactly the described kinds, and
// the full optimizer state holds exactly those (and a step where it counts steps).
TEST(CheckpointState, EverySavedOptimizerStateHoldsExactlyTheDescribedKinds) {
  const std::vector<OptimizerCase> cases = optimizer_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const OptimizerCase& c = cases[i];
    if (c.matrices_only) continue;  // Muon, over the matrices beside an AdamW: checkpoint_two_optimizers_test.cpp
    SCOPED_TRACE(c.label);
    const auto& kind = *fsdp::optimizers::find_optimizer(c.described_as);
    const std::vector<std::string> described = fsdp::optimizers::kinds_kept(kind, c.options);
    auto model = fsdp::fully_shard(fresh_net(), *dist().world);
    auto optimizer = c.make(model->parameters());
    train([&](const torch::Tensor& x) { return model(x); }, *optimizer, 0, 1);
    const std::string folder = shared_folder("checkpoint-state", "kinds-" + std::to_string(i));
    fsdp::save_sharded(model, *optimizer, folder);
    std::map<std::string, torch::Tensor> full;
    for (auto& [key, tensor] : fsdp::gather_full_optimizer_state(model, *optimizer)) full.emplace(key, tensor);

    nlohmann::json meta;
    std::ifstream(folder + "/metadata.json") >> meta;
    EXPECT_EQ(meta.at("optimizer").get<std::string>(), kind.name);
    size_t keys = 0;
    for (const auto& param : meta.at("params")) {
      const std::string name = param.at("name").get<std::string>();
      const auto saved = param.at("optimizer_moments").get<std::set<std::string>>();  // by name
      EXPECT_EQ(saved, std::set<std::string>(described.begin(), described.end())) << name;
      for (const auto& k : described) EXPECT_EQ(full.count("state." + name + "." + k), 1u) << name << " " << k;
      EXPECT_EQ(full.count("state." + name + ".step"), kind.counts_steps ? 1u : 0u) << name;
      keys += described.size() + (kind.counts_steps ? 1 : 0);
    }
    EXPECT_EQ(full.size(), keys) << "no state beyond the described";
    barrier();
    if (dist().rank() == 0) fs::remove_all(folder);
  }
}

}  // namespace
}  // namespace fsdp_test
