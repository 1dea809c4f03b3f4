// fsdp::optim::StepInBackward with an optimizer other than AdamW: fsdp::optim::SGD implements the
// same interface (fsdp::optim::StepsInBackward), and stepping each unit as its reduced gradient
// lands gives the shards that stepping after backward gives, bitwise, as for AdamW
// (tests/training_features_test.cpp).
#include "dist_env.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <vector>

namespace fsdp_test {
namespace {

struct SgdRun {
  std::vector<torch::Tensor> shards;  // every parameter's shard after the last step
  int64_t held = 0;                   // parameters with elements on this rank
  int64_t moved_in_backward = 0;      // of those, stepped before step() in the first step
};

// Three steps of SGD with momentum and weight decay on OddNet, each rank its own rows; `during`:
// each step's units are stepped in backward (StepInBackward), step() steps the rest.
SgdRun train_odd_net_with_sgd(fsdp::ShardingStrategy strategy, bool during) {
  constexpr int64_t kRows = 3;
  const int world = dist().world_size(), rank = dist().rank();
  auto model = fsdp::fully_shard(make_odd_net(8), *dist().world, fsdp::FullyShardOptions().strategy(strategy));
  fsdp::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01));
  SgdRun run;
  for (int64_t step = 0; step < 3; ++step) {
    auto [x, y] = odd_batch(step, kRows * world);
    sgd.zero_grad();
    std::vector<torch::Tensor> before;  // the shards, between steps
    for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
    const auto loss = torch::mse_loss(model(x.narrow(0, kRows * rank, kRows)), y.narrow(0, kRows * rank, kRows));
    if (during) {
      fsdp::optim::StepInBackward overlap(model, sgd);
      loss.backward();
    } else {
      loss.backward();
    }
    sgd.wait_queued_steps();
    if (step == 0) {
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        run.held += params[i].numel() > 0;
        run.moved_in_backward += params[i].numel() > 0 && !torch::equal(params[i], before[i]);
      }
    }
    sgd.step();
  }
  for (const auto& p : model->parameters()) run.shards.push_back(p.detach().clone());
  return run;
}

TEST(StepInBackward, SgdEqualsSteppingAfterBackwardBitwise) {
  using S = fsdp::ShardingStrategy;
  for (S strategy : {S::FullShard, S::ShardGradOp, S::NoShard}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    const SgdRun after = train_odd_net_with_sgd(strategy, /*during=*/false);
    const SgdRun during = train_odd_net_with_sgd(strategy, /*during=*/true);
    EXPECT_EQ(after.moved_in_backward, 0);
    // Every unit's parameters were stepped in backward; the root's (head, gain) too, as the
    // root's reduction is issued last.
    EXPECT_EQ(during.moved_in_backward, during.held);
    ASSERT_EQ(during.shards.size(), after.shards.size());
    for (size_t i = 0; i < after.shards.size(); ++i) {
      EXPECT_TRUE(torch::equal(during.shards[i], after.shards[i])) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace fsdp_test

namespace fsdp_test {
namespace {

struct MuonRun {
  std::vector<torch::Tensor> shards;  // every parameter's shard after the last step
  int64_t matrices_in_backward = 0;   // Muon's matrices with elements here, stepped before step()
  int64_t others_in_backward = 0;     // SGD's parameters likewise
};

// Three steps of Muon on OddNet's hidden matrices (split_for_muon: first and second; the head is
// AdamW's) and SGD on the rest; `during`: both step each unit's parameters in backward.
MuonRun train_odd_net_with_muon(fsdp::ShardingStrategy strategy, bool during) {
  constexpr int64_t kRows = 3;
  const int world = dist().world_size(), rank = dist().rank();
  auto model = fsdp::fully_shard(make_odd_net(8), *dist().world, fsdp::FullyShardOptions().strategy(strategy));
  const auto split = fsdp::optim::split_for_muon(*model);
  EXPECT_EQ(split.matrix_names, (std::vector<std::string>{"first.weight", "second.weight"}));
  fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
  fsdp::optim::SGD sgd(split.others, torch::optim::SGDOptions(0.05).momentum(0.9));
  MuonRun run;
  for (int64_t step = 0; step < 3; ++step) {
    auto [x, y] = odd_batch(step, kRows * world);
    muon.zero_grad();
    sgd.zero_grad();
    std::vector<torch::Tensor> before;
    for (const auto& p : split.matrices) before.push_back(p.detach().clone());
    const auto loss = torch::mse_loss(model(x.narrow(0, kRows * rank, kRows)), y.narrow(0, kRows * rank, kRows));
    std::vector<torch::Tensor> others;
    for (const auto& p : split.others) others.push_back(p.detach().clone());
    if (during) {
      fsdp::optim::StepInBackward overlap(model, {&muon, &sgd});  // both, each its own parameters
      loss.backward();
    } else {
      loss.backward();
    }
    muon.wait_queued_steps();
    sgd.wait_queued_steps();
    for (size_t i = 0; i < before.size(); ++i) {
      run.matrices_in_backward += before[i].numel() > 0 && !torch::equal(split.matrices[i], before[i]);
    }
    for (size_t i = 0; i < others.size(); ++i) {
      run.others_in_backward += others[i].numel() > 0 && !torch::equal(split.others[i], others[i]);
    }
    muon.step();
    sgd.step();
  }
  for (const auto& p : model->parameters()) run.shards.push_back(p.detach().clone());
  return run;
}

TEST(StepInBackward, MuonAndSgdEqualSteppingAfterBackwardBitwise) {
  using S = fsdp::ShardingStrategy;
  for (S strategy : {S::FullShard, S::ShardGradOp, S::NoShard}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    const MuonRun after = train_odd_net_with_muon(strategy, /*during=*/false);
    const MuonRun during = train_odd_net_with_muon(strategy, /*during=*/true);
    EXPECT_EQ(after.matrices_in_backward + after.others_in_backward, 0);
    EXPECT_GT(during.matrices_in_backward, 0);
    EXPECT_GT(during.others_in_backward, 0);
    ASSERT_EQ(during.shards.size(), after.shards.size());
    for (size_t i = 0; i < after.shards.size(); ++i) {
      EXPECT_TRUE(torch::equal(during.shards[i], after.shards[i])) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace fsdp_test
