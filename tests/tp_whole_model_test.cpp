// A 2-D model (fully_shard over parallelize_module) saved and loaded whole the way an unsplit
// LibTorch program does it: torch::save and torch::load inside fsdp::SummonFullParams, each
// tensor-parallel part gathered over its tp group, each rank keeping its own part on the way
// back ([Note: a tensor-parallel part shown whole] in src/io/summon_full_params.cpp). tp 2 where
// the world is even (W = 2: 1 x 2, W = 4: 2 x 2), else tp 1.
#include "dist_env.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>

#include <unistd.h>

namespace fsdp_test {
namespace {

struct TwoD {
  std::unique_ptr<fsdp::DeviceMesh> mesh;
  fsdp::Unit<TinyLm> model;
};

// The tiny model split over tp and sharded over dp, from seeded_model()'s values.
TwoD two_d_model() {
  const int world = dist().world_size(), tp_size = world % 2 == 0 ? 2 : 1;
  TwoD made;
  made.mesh = std::make_unique<fsdp::DeviceMesh>(dist().world,
                                                 std::vector<fsdp::MeshDim>{{"dp", world / tp_size}, {"tp", tp_size}});
  TinyLm split = seeded_model();
  split->tp = std::make_shared<fsdp::tp::TensorParallel>(made.mesh->group_ptr("tp"));
  fsdp::tp::parallelize_module(*split, split->tp, tiny_plan());
  made.model = fsdp::fully_shard(split, made.mesh->group("dp"));
  return made;
}

std::string rank_file(const char* what) {
  return "/tmp/fsdp_tp_" + std::string(what) + "_" + std::to_string(::getpid()) + ".pt";  // each rank its own
}

}  // namespace

TEST(TensorParallelMesh, TorchSaveInsideSummonFullParamsWritesTheWholeModel) {
  TwoD two_d = two_d_model();
  const std::string file = rank_file("summon_save");
  {
    fsdp::SummonFullParams full(two_d.model);
    torch::save(two_d.model, file);  // every rank: each file must hold the whole model
  }
  torch::manual_seed(99);
  TinyLm loaded;  // other values, replaced by the file's
  torch::load(loaded, file);
  std::remove(file.c_str());
  TinyLm whole = seeded_model();
  auto loaded_params = loaded->named_parameters();
  for (const auto& item : whole->named_parameters()) {
    const torch::Tensor& value = loaded_params[item.key()];
    ASSERT_EQ(value.sizes(), item.value().sizes()) << item.key() << ": the file holds a tensor-parallel part";
    EXPECT_TRUE(torch::equal(value, item.value())) << item.key();
  }
}

TEST(TensorParallelMesh, TorchLoadInsideSummonFullParamsKeepsEachRanksPart) {
  torch::manual_seed(11);
  TinyLm other;  // the whole model the file holds: values unlike seeded_model()'s
  const std::string file = rank_file("summon_load");
  torch::save(other, file);
  TwoD two_d = two_d_model();
  {
    fsdp::SummonFullParams full(two_d.model);
    torch::load(two_d.model, file);
  }
  std::remove(file.c_str());
  auto other_params = other->named_parameters();
  for (auto& [name, value] : fsdp::gather_full_params(two_d.model)) {
    ASSERT_EQ(value.sizes(), other_params[name].sizes()) << name;
    EXPECT_TRUE(torch::equal(value, other_params[name])) << name << ": a rank kept another's part";
  }
  // And the split model computes what the loaded one does (the same rows on every rank).
  auto [ids, targets] = batch();
  const double loss = two_d.model->loss(two_d.model->forward(ids), targets).item<double>();
  EXPECT_NEAR(loss, other->loss(other->forward(ids), targets).item<double>(), 1e-5);
}

}  // namespace fsdp_test
