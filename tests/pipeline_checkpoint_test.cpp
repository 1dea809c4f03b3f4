// Checkpoints of a pipelined model (include/fsdp/pipeline_checkpoint.h) at pp 2 x dp 1, through
// the library alone: a model of a user's shape split unevenly, trained 2 AdamW steps, saved by
// its two stages into one folder, which then loads into a fresh pipeline (bitwise the saved
// parameters) and into the unsplit model sharded over both ranks (fsdp::load_sharded): with its
// AdamW state and lr, a step of each from there gives the same parameters (within 1e-5).
#include "dist_env.h"
#include "pipeline_model.h"

#include <fsdp/checkpoint.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp/pipeline.h>
#include <fsdp/pipeline_checkpoint.h>
#include <fsdp/state_dict.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <unistd.h>

namespace fsdp_test {
// Named, not anonymous: the unity build compiles this file with the other pipeline tests.
namespace pipeline_checkpoint {

constexpr int64_t kBatch = 4, kTokens = 6;
const std::vector<std::vector<std::string>> kSplit{{"wte", "h.0"}, {"h.1", "h.2", "h.3", "ln_f", "head"}};

torch::Tensor summed_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, kPpVocab}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  torch::manual_seed(300 + step);
  return {torch::randint(kPpVocab, {kBatch, kTokens}, torch::kLong),
          torch::randint(kPpVocab, {kBatch, kTokens}, torch::kLong)};
}

// A folder every rank names alike (rank 0's pid); rank 0 removes it at the end.
std::string shared_folder() {
  auto pid = torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong);
  fsdp::broadcast(*dist().world, pid, 0);
  return "/tmp/fsdp-pp-checkpoint-test-" + std::to_string(pid.item<int64_t>());
}

// The unsplit model's step on the same batch: the mean over its rows, as the pipeline's.
void unsplit_step(fsdp::Unit<PpNet>& model, torch::optim::Optimizer& optim, int step) {
  const auto [ids, targets] = batch(step);
  optim.zero_grad();
  (summed_loss(model->forward(ids), targets) / static_cast<double>(ids.numel())).backward();
  optim.step();
}

// A pipeline of the same split built from other initial values loads the folder: its stage's
// parameters are bitwise the saved ones.
void expect_a_fresh_pipeline_loads(fsdp::DeviceMesh& mesh, const std::string& folder, const fsdp::NamedTensors& saved) {
  torch::manual_seed(99);
  PpNet net;
  fsdp::pp::Stage stage(*net, parts_of(net), kSplit, mesh.coordinate("pp"));
  stage.fully_shard(mesh.group("dp"));
  fsdp::pp::Pipeline pipe(std::move(stage), mesh.group_ptr("pp"), summed_loss,
                          fsdp::pp::PipelineOptions().microbatches(2));
  torch::optim::AdamW optim(pipe.stage().parameters(), torch::optim::AdamWOptions(1e-3));
  EXPECT_EQ(fsdp::pp::load_sharded(pipe, *dist().world, optim, folder).at("step"), 2);
  const fsdp::NamedTensors loaded = fsdp::gather_full_params(pipe.stage().sharded_model());
  ASSERT_EQ(loaded.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(loaded[i].first, saved[i].first);
    EXPECT_TRUE(torch::equal(loaded[i].second, saved[i].second)) << saved[i].first;
  }
}

TEST(PipelineCheckpoint, TwoStagesSaveOneFolderThatTheUnsplitModelLoads) {
  if (dist().world_size() != 2) GTEST_SKIP() << "pp 2 x dp 1";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", 2}, {"dp", 1}});
  PpNet net = seeded_pp_net();
  fsdp::pp::Stage stage(*net, parts_of(net), kSplit, mesh.coordinate("pp"));
  stage.fully_shard(mesh.group("dp"));
  fsdp::pp::Pipeline pipe(std::move(stage), mesh.group_ptr("pp"), summed_loss,
                          fsdp::pp::PipelineOptions().microbatches(2));
  torch::optim::AdamW optim(pipe.stage().parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 2; ++step) {
    const auto [ids, targets] = batch(step);
    optim.zero_grad();
    pipe.step(ids, targets);
    optim.step();
  }
  const std::string folder = shared_folder();
  fsdp::pp::save_sharded(pipe, *dist().world, optim, folder, {{"step", 2}});
  expect_a_fresh_pipeline_loads(mesh, folder, fsdp::gather_full_params(pipe.stage().sharded_model()));

  torch::manual_seed(99);  // other initial values: the load must replace every one
  auto unsplit = fsdp::fully_shard(PpNet(), *dist().world);
  torch::optim::AdamW unsplit_optim(unsplit->parameters(), torch::optim::AdamWOptions(1e-3));
  EXPECT_EQ(fsdp::load_sharded(unsplit, unsplit_optim, folder).at("step"), 2);
  EXPECT_DOUBLE_EQ(unsplit_optim.param_groups()[0].options().get_lr(), 1e-2);  // the saved lr

  // Both step once more from the checkpoint: the same batch and state give the same parameters.
  const auto [ids, targets] = batch(2);
  optim.zero_grad();
  pipe.step(ids, targets);
  optim.step();
  unsplit_step(unsplit, unsplit_optim, 2);
  const fsdp::NamedTensors mine = fsdp::gather_full_params(pipe.stage().sharded_model());
  std::map<std::string, torch::Tensor> whole;
  for (const auto& [name, tensor] : fsdp::gather_full_params(unsplit)) whole[name] = tensor;
  ASSERT_FALSE(mine.empty());
  double worst = 0;
  for (const auto& [name, tensor] : mine) {
    ASSERT_TRUE(whole.count(name)) << name << ": saved under a name the unsplit model lacks";
    worst = std::max(worst, (tensor - whole[name]).abs().max().item<double>());
    EXPECT_LT((tensor - whole[name]).abs().max().item<double>(), 1e-5) << name;
  }
  std::printf("stage %d: %zu parameters within %.2g of the unsplit model's after a step from the checkpoint\n",
              pipe.stage().index(), mine.size(), worst);
  auto done = torch::zeros({1});
  fsdp::all_reduce_sum(*dist().world, done);
  if (dist().rank() == 0) std::filesystem::remove_all(folder);
}

}  // namespace pipeline_checkpoint
}  // namespace fsdp_test
