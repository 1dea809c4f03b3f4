// Checkpoints of a pipelined model (include/fsdp/pipeline_checkpoint.h) at pp 2 x dp 1, through
// the library alone: a model of a user's shape split unevenly, trained 2 AdamW steps, saved by
// its two stages into one folder, which then loads into a fresh pipeline (bitwise the saved
// parameters) and into the unsplit model sharded over both ranks (fsdp::load_sharded): with its
// AdamW state and lr, a step of each from there gives the same parameters (within 1e-5).
// Interleaved 1F1B (two stages per rank, W = 2 and 4): saved into one folder (the asynchronous
// save's byte for byte the same), loaded into interleaved stages, the unsplit model and 1F1B
// stages of another split, and back.
#include "dist_env.h"
#include "pipeline_model.h"

#include <fsdp/checkpoint.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp/pipeline.h>
#include <fsdp/pipeline_checkpoint.h>
#include <fsdp/state_dict.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
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


// Interleaved 1F1B at pp 2 x dp 2 (W = 4; dp 1 at W = 2): two sharded stages per rank (rank 0 of
// "pp" runs stages 0 and 2), one AdamW over both.
const std::vector<std::vector<std::string>> kFourStages{{"wte", "h.0"}, {"h.1"}, {"h.2"}, {"h.3", "ln_f", "head"}};

using Split = std::vector<std::vector<std::string>>;

fsdp::pp::Pipeline sharded_pipeline(PpNet& net, fsdp::DeviceMesh& mesh, const Split& split, fsdp::pp::Schedule schedule) {
  std::vector<fsdp::pp::Stage> stages;
  const int num_stages = static_cast<int>(split.size());
  for (int s : fsdp::pp::stages_of_rank(mesh.coordinate("pp"), 2, num_stages, fsdp::pp::placement_of(schedule))) {
    stages.emplace_back(*net, parts_of(net), split, s);
    stages.back().fully_shard(mesh.group("dp"));
  }
  return fsdp::pp::Pipeline(std::move(stages), mesh.group_ptr("pp"), summed_loss,
                            fsdp::pp::PipelineOptions().schedule(schedule).microbatches(4));
}

void pipeline_step(fsdp::pp::Pipeline& pipe, torch::optim::Optimizer& optim, int step) {
  const auto [ids, targets] = batch(step);
  optim.zero_grad();
  pipe.step(ids, targets);
  optim.step();
}

// Every parameter of this rank's stages, whole, by name.
std::map<std::string, torch::Tensor> local_whole_params(fsdp::pp::Pipeline& pipe) {
  std::map<std::string, torch::Tensor> whole;
  for (fsdp::pp::Stage& stage : pipe.stages()) {
    for (const auto& [name, value] : fsdp::gather_full_params(stage.sharded_model())) whole[name] = value;
  }
  return whole;
}

// Each of `expected`'s parameters that this rank's stages hold is bitwise the same in `pipe`.
void expect_params_equal(fsdp::pp::Pipeline& pipe, const std::map<std::string, torch::Tensor>& expected,
                         const std::string& layout) {
  const auto loaded = local_whole_params(pipe);
  ASSERT_FALSE(loaded.empty());
  for (const auto& [name, value] : loaded) {
    ASSERT_TRUE(expected.count(name)) << layout << ": " << name;
    EXPECT_TRUE(torch::equal(value, expected.at(name))) << layout << ": " << name;
  }
}

// The AdamW state of each parameter of `a` and `b` (the same layout), bitwise equal.
void expect_adamw_state_equal(const fsdp::pp::Pipeline& a, torch::optim::AdamW& optim_a,
                              const fsdp::pp::Pipeline& b, torch::optim::AdamW& optim_b) {
  const auto params_a = a.parameters(), params_b = b.parameters();
  ASSERT_EQ(params_a.size(), params_b.size());
  for (size_t i = 0; i < params_a.size(); ++i) {
    ASSERT_TRUE(optim_b.state().count(params_b[i].unsafeGetTensorImpl())) << "parameter " << i << ": no state loaded";
    using State = torch::optim::AdamWParamState;
    const auto& sa = static_cast<const State&>(*optim_a.state().at(params_a[i].unsafeGetTensorImpl()));
    const auto& sb = static_cast<const State&>(*optim_b.state().at(params_b[i].unsafeGetTensorImpl()));
    EXPECT_EQ(sa.step(), sb.step()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(sa.exp_avg(), sb.exp_avg())) << "parameter " << i;
    EXPECT_TRUE(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << "parameter " << i;
  }
}

// Every file of folder `a` is byte for byte the same in `b`, and `b` has no other.
void expect_same_files(const std::string& a, const std::string& b) {
  auto bytes = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(a)) {
    ++count;
    const auto other = std::filesystem::path(b) / entry.path().filename();
    ASSERT_TRUE(std::filesystem::exists(other)) << other;
    EXPECT_EQ(bytes(entry.path()), bytes(other)) << entry.path().filename();
  }
  EXPECT_EQ(count, static_cast<size_t>(std::distance(std::filesystem::directory_iterator(b), {})));
}

void barrier_then_remove(const std::string& folder) {
  auto done = torch::zeros({1});
  fsdp::all_reduce_sum(*dist().world, done);
  if (dist().rank() == 0) std::filesystem::remove_all(folder);
}

TEST(PipelineCheckpoint, InterleavedStagesSaveOneFolderThatEveryLayoutLoads) {
  const int world = dist().world_size();
  if (world != 2 && world != 4) GTEST_SKIP() << "pp 2 x dp 1 or pp 2 x dp 2";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", 2}, {"dp", world / 2}});
  const auto interleaved = fsdp::pp::Schedule::Interleaved1F1B;
  PpNet net = seeded_pp_net();
  fsdp::pp::Pipeline pipe = sharded_pipeline(net, mesh, kFourStages, interleaved);
  ASSERT_EQ(pipe.stages().size(), 2u);
  torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 2; ++step) pipeline_step(pipe, optim, step);
  const std::string root = shared_folder();
  const std::string folder = fsdp::pp::save_checkpoint(pipe, *dist().world, optim, root + "/sync", 2);
  const auto saved = local_whole_params(pipe);

  // The asynchronous save publishes the same folder, byte for byte, staged in the arena reserved
  // for both stages' files.
  fsdp::pp::reserve_staging_arena(pipe, {&optim});
  const fsdp::AsyncSave async = fsdp::pp::save_checkpoint_async(pipe, *dist().world, optim, root + "/async", 2);
  async.wait();
  EXPECT_TRUE(async.reused_arena());
  if (dist().rank() == 0) expect_same_files(folder, async.folder());

  // A fresh interleaved pipeline of other initial values: bitwise the parameters and AdamW state.
  torch::manual_seed(99);
  PpNet fresh_net;
  fsdp::pp::Pipeline fresh = sharded_pipeline(fresh_net, mesh, kFourStages, interleaved);
  torch::optim::AdamW fresh_optim(fresh.parameters(), torch::optim::AdamWOptions(1e-3));
  EXPECT_EQ(fsdp::pp::load_sharded(fresh, *dist().world, fresh_optim, folder).at("step"), 2);
  expect_params_equal(fresh, saved, "interleaved");
  expect_adamw_state_equal(pipe, optim, fresh, fresh_optim);
  EXPECT_DOUBLE_EQ(fresh_optim.param_groups()[0].options().get_lr(), 1e-2);

  // The unsplit model sharded over every rank (pp 1, dp W): the same values, whole on every rank.
  torch::manual_seed(99);
  auto unsplit = fsdp::fully_shard(PpNet(), *dist().world);
  torch::optim::AdamW unsplit_optim(unsplit->parameters(), torch::optim::AdamWOptions(1e-3));
  EXPECT_EQ(fsdp::load_sharded(unsplit, unsplit_optim, folder).at("step"), 2);
  std::map<std::string, torch::Tensor> whole;
  for (const auto& [name, value] : fsdp::gather_full_params(unsplit)) whole[name] = value;
  expect_params_equal(pipe, whole, "pp 1 x dp W");

  // 1F1B at the same mesh, two stages of another split: the same values; saved again from there,
  // its folder loads into interleaved stages bitwise.
  torch::manual_seed(99);
  PpNet one_net;
  fsdp::pp::Pipeline one = sharded_pipeline(one_net, mesh, kSplit, fsdp::pp::Schedule::OneFOneB);
  torch::optim::AdamW one_optim(one.parameters(), torch::optim::AdamWOptions(1e-3));
  fsdp::pp::load_sharded(one, *dist().world, one_optim, folder);
  expect_params_equal(one, whole, "1f1b");
  const std::string again = fsdp::pp::save_checkpoint(one, *dist().world, one_optim, root + "/1f1b", 2);
  torch::manual_seed(98);
  PpNet back_net;
  fsdp::pp::Pipeline back = sharded_pipeline(back_net, mesh, kFourStages, interleaved);
  torch::optim::AdamW back_optim(back.parameters(), torch::optim::AdamWOptions(1e-3));
  fsdp::pp::load_sharded(back, *dist().world, back_optim, again);
  expect_params_equal(back, saved, "1f1b back to interleaved");
  expect_adamw_state_equal(pipe, optim, back, back_optim);

  // A step of the interleaved pipeline and of the unsplit model from the checkpoint: the same
  // parameters (the AdamW state and lr resumed in both).
  pipeline_step(pipe, optim, 2);
  unsplit_step(unsplit, unsplit_optim, 2);
  whole.clear();
  for (const auto& [name, value] : fsdp::gather_full_params(unsplit)) whole[name] = value;
  double worst = 0;
  for (const auto& [name, value] : local_whole_params(pipe)) {
    worst = std::max(worst, (value - whole.at(name)).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-5);
  std::printf("interleaved rank %d: a step from the checkpoint within %.2g of the unsplit model's\n", dist().rank(),
              worst);
  barrier_then_remove(root);
}

// A rank's second stage left unsharded: every save and load refuses it by name, on every rank,
// before any collective, and nothing is written.
TEST(PipelineCheckpoint, AnUnshardedSecondStageIsRefusedByName) {
  if (dist().world_size() != 2) GTEST_SKIP() << "pp 2 x dp 1";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", 2}, {"dp", 1}});
  const auto interleaved = fsdp::pp::Schedule::Interleaved1F1B;
  PpNet net = seeded_pp_net();
  std::vector<fsdp::pp::Stage> stages;
  for (int s : fsdp::pp::stages_of_rank(mesh.coordinate("pp"), 2, 4, fsdp::pp::placement_of(interleaved))) {
    stages.emplace_back(*net, parts_of(net), kFourStages, s);
    if (stages.size() == 1) stages.back().fully_shard(mesh.group("dp"));
  }
  const int unsharded = stages.back().index();
  fsdp::pp::Pipeline pipe(std::move(stages), mesh.group_ptr("pp"), summed_loss,
                          fsdp::pp::PipelineOptions().schedule(interleaved).microbatches(4));
  torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(1e-3));
  const std::string folder = shared_folder();
  auto error_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  const std::string needle = "stage " + std::to_string(unsharded) + " is not sharded";
  for (const std::string& error :
       {error_of([&] { fsdp::pp::save_sharded(pipe, *dist().world, optim, folder); }),
        error_of([&] { fsdp::pp::save_checkpoint_async(pipe, *dist().world, optim, folder, 1); }),
        error_of([&] { fsdp::pp::load_sharded(pipe, *dist().world, optim, folder); })}) {
    EXPECT_NE(error.find(needle), std::string::npos) << error;
    EXPECT_NE(error.find("a dp group of one rank too"), std::string::npos) << error;
  }
  EXPECT_FALSE(std::filesystem::exists(folder));
}

// A checkpoint that lacks a parameter of each rank's second stage (h.2's, h.3's): the load is
// refused on every rank, naming it, and the first stages (staged and agreed on already) keep their
// values too.
TEST(PipelineCheckpoint, AFailedLoadChangesNoneOfTheRanksStages) {
  if (dist().world_size() != 2) GTEST_SKIP() << "pp 2 x dp 1";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", 2}, {"dp", 1}});
  const auto interleaved = fsdp::pp::Schedule::Interleaved1F1B;
  PpNet net = seeded_pp_net();
  fsdp::pp::Pipeline pipe = sharded_pipeline(net, mesh, kFourStages, interleaved);
  torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(1e-2));
  pipeline_step(pipe, optim, 0);
  const std::string folder = shared_folder();
  fsdp::pp::save_sharded(pipe, *dist().world, optim, folder);
  if (dist().rank() == 0) {
    const std::string path = folder + "/metadata.json";
    std::ifstream in(path);
    nlohmann::json meta = nlohmann::json::parse(in);
    in.close();
    auto later_stage = [](const std::string& name) { return name.rfind("h.2.", 0) == 0 || name.rfind("h.3.", 0) == 0; };
    auto& params = meta["params"];
    params.erase(std::remove_if(params.begin(), params.end(),
                                [&](const nlohmann::json& p) { return later_stage(p["name"]); }),
                 params.end());
    std::ofstream(path) << meta.dump();
  }
  auto done = torch::zeros({1});
  fsdp::all_reduce_sum(*dist().world, done);  // edited before any rank reads it

  torch::manual_seed(99);
  PpNet fresh_net;
  fsdp::pp::Pipeline fresh = sharded_pipeline(fresh_net, mesh, kFourStages, interleaved);
  torch::optim::AdamW fresh_optim(fresh.parameters(), torch::optim::AdamWOptions(1e-3));
  const auto before = local_whole_params(fresh);
  std::string error;
  try {
    fsdp::pp::load_sharded(fresh, *dist().world, fresh_optim, folder);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  EXPECT_NE(error.find("load_sharded: cannot load"), std::string::npos) << error;
  EXPECT_NE(error.find("'h.2."), std::string::npos) << error;  // rank 0's error, on every rank
  expect_params_equal(fresh, before, "after a failed load");
  EXPECT_TRUE(fresh_optim.state().empty());
  barrier_then_remove(folder);
}

}  // namespace pipeline_checkpoint
}  // namespace fsdp_test
