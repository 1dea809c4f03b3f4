// Dropout under tensor parallelism: fsdp::tp::manual_seed gives every rank of a tp group one
// generator state (and each group its own), and replicated parameters that drifted apart over
// a tp group are named at the next full-state save ([Note: replicas that drifted apart] in
// src/io/tp_replica_check.cpp). tp 2 where the world is even, else nothing to compare.
#include "dist_env.h"
#include "shared_folder.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace fsdp_test {

TEST(TensorParallelMesh, ManualSeedGivesOneGeneratorStatePerTpGroup) {
  const int world = dist().world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even world";
  fsdp::DeviceMesh mesh(dist().world, {{"dp", world / 2}, {"tp", 2}});
  fsdp::tp::manual_seed(mesh, 7);
  const torch::Tensor mask = torch::rand({64});  // what dropout draws
  auto& tp = mesh.group("tp");
  const torch::Tensor first = mask.clone();
  fsdp::broadcast(tp, first, 0);
  EXPECT_TRUE(torch::equal(mask, first)) << "the ranks of one tp group drew different masks";
  const torch::Tensor first_group = mask.clone();
  fsdp::broadcast(mesh.group("dp"), first_group, 0);
  if (mesh.coordinate("dp") != 0) {
    EXPECT_FALSE(torch::equal(mask, first_group)) << "two tp groups drew one mask";
  }
}

TEST(TensorParallelMesh, ReplicatedParametersThatDriftedApartAreNamedAtTheFullStateAndCheckpointSaves) {
  const int world = dist().world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even world";
  fsdp::DeviceMesh mesh(dist().world, {{"dp", world / 2}, {"tp", 2}});
  TinyLm split = seeded_model();
  split->tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  fsdp::tp::parallelize_module(*split, split->tp, tiny_plan());
  auto model = fsdp::fully_shard(split, mesh.group("dp"));
  const bool reports = dist().rank() == 0;  // rank 0 warns

  testing::internal::CaptureStderr();
  fsdp::gather_full_params(model);
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("differ across the ranks"), std::string::npos);

  {  // tp rank 1's norm drifts, as per-rank dropout makes it drift
    fsdp::SummonFullParams full(model);
    if (mesh.coordinate("tp") == 1) model->norm->weight.add_(0.01);
  }
  testing::internal::CaptureStderr();
  fsdp::gather_full_params(model);
  const std::string warning = testing::internal::GetCapturedStderr();
  if (reports) {
    EXPECT_NE(warning.find("the replicated parameters 'norm.weight' differ across the ranks of a "
                           "tensor-parallel group"), std::string::npos) << warning;
    EXPECT_NE(warning.find("fsdp::tp::manual_seed(mesh, seed)"), std::string::npos) << warning;
  }

  // The same at a checkpoint's save, which keeps tp rank 0's values of the replicated ones.
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string folder = shared_folder("tp-dropout-seed", "drifted");
  testing::internal::CaptureStderr();
  fsdp::save_checkpoint(model, optimizer, folder, 1);
  const std::string at_save = testing::internal::GetCapturedStderr();
  remove_shared(folder);
  if (reports) {
    EXPECT_NE(at_save.find("save_sharded: the replicated parameters 'norm.weight' differ across the ranks"),
              std::string::npos) << at_save;
  }
}

}  // namespace fsdp_test
