// Asynchronous sharded checkpoints (include/fsdp/async_checkpoint.h) over real ranks: the folder
// is byte for byte a synchronous save's of the same state (staged at once or in waves); training
// goes on while the background thread writes, and the checkpoint holds the step's state, not a
// later one; an error of the write comes from wait(), on every rank, naming the folder; the next
// save completes the previous one. A kill -9 during the background write: tests/checkpoint_e2e.py.
#include "dist_env.h"
#include "error_of.h"
#include "shared_folder.h"
#include "test_models.h"

#include <fsdp/async_checkpoint.h>
#include <fsdp/checkpoint.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>

namespace fsdp_test {
namespace {

namespace fs = std::filesystem;
namespace o = torch::optim;

constexpr int64_t kSavedStep = 2;

// A sharded BatchNormNet (buffers too) and its AdamW, trained `steps` steps.
struct Trained {
  fsdp::Unit<BatchNormNet> model;
  std::unique_ptr<o::AdamW> optimizer;
  explicit Trained(int steps) : model(fresh()), optimizer(make_optimizer(model)) { train(0, steps); }
  static fsdp::Unit<BatchNormNet> fresh() {
    torch::manual_seed(11);
    return fsdp::fully_shard(BatchNormNet(), *dist().world);
  }
  static std::unique_ptr<o::AdamW> make_optimizer(fsdp::Unit<BatchNormNet>& model) {
    return std::make_unique<o::AdamW>(model->parameters(), o::AdamWOptions(0.01));
  }
  void train(int first, int last) {
    for (int step = first; step < last; ++step) {
      auto gen = at::detail::createCPUGenerator(500 + step);
      const auto x = torch::randn({8, 5}, gen), y = torch::randn({8, 3}, gen);
      optimizer->zero_grad();
      torch::mse_loss(model(x), y).backward();
      optimizer->step();
    }
  }
  // Everything a checkpoint holds, full, on every rank (a collective).
  fsdp::NamedTensors state() {
    auto all = fsdp::gather_full_params(model);
    for (auto& item : fsdp::gather_full_optimizer_state(model, *optimizer)) all.push_back(item);
    for (auto& item : model->named_buffers()) all.emplace_back(item.key(), item.value().clone());
    return all;
  }
};

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every file of `folder` by name, with its bytes.
std::map<std::string, std::string> folder_files(const std::string& folder) {
  std::map<std::string, std::string> files;
  for (const auto& item : fs::directory_iterator(folder)) files[item.path().filename()] = file_bytes(item.path());
  return files;
}

void expect_bitwise_equal(const fsdp::NamedTensors& got, const fsdp::NamedTensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << what << ": " << got[i].first;
  }
}

// The state of the checkpoint `folder`, loaded into a fresh model and optimizer.
fsdp::NamedTensors loaded_state(const std::string& folder) {
  Trained fresh(0);
  fsdp::load_sharded(fresh.model, *fresh.optimizer, folder);
  return fresh.state();
}

// An asynchronous save of `run` into `dir` with the smallest budget (a multiple of the arena's
// 64-byte alignment) that holds each of a rank's files: a rank with several stages in waves.
fsdp::AsyncSave save_with_smallest_budget(Trained& run, const std::string& dir) {
  for (int64_t budget = 64;; budget += 64) {
    std::optional<fsdp::AsyncSave> saving;
    const std::string refused = error_of([&] {
      saving = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir, kSavedStep, {}, 0,
                                           fsdp::AsyncSaveOptions().staging_budget_bytes(budget));
    });
    if (saving) return *saving;
    EXPECT_NE(refused.find("more than the staging budget"), std::string::npos) << refused;
    if (budget > (int64_t{1} << 20)) throw std::runtime_error("no budget holds the files: " + refused);
  }
}

TEST(AsyncSave, FolderIsByteIdenticalToASynchronousSave) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank writes one file: nothing to stage in waves";
  Trained run(kSavedStep);
  const std::string dir = shared_folder("async-save", "identical");
  const std::string sync_folder = fsdp::save_checkpoint(run.model, *run.optimizer, dir + "/sync", kSavedStep);
  auto saving = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir + "/async", kSavedStep);
  saving.wait();
  EXPECT_TRUE(saving.done());
  // A budget below one rank's shards: staged and written in waves of whole files.
  auto in_waves = save_with_smallest_budget(run, dir + "/waves");
  in_waves.wait();
  auto ranks_in_waves = torch::full({1}, in_waves.staged_waves() > 1 ? 1.0 : 0.0);
  fsdp::all_reduce_sum(*dist().world, ranks_in_waves);
  // At W = 2 rank 0's files do not fit the budget together (at other sizes the files may each be
  // alone on their rank: the folder is still compared).
  if (dist().world_size() == 2) {
    EXPECT_GT(ranks_in_waves.item<double>(), 0) << "no rank staged in waves: the test proves nothing";
  }
  EXPECT_EQ(saving.staged_waves(), 1);
  barrier();
  const auto want = folder_files(sync_folder);
  EXPECT_GT(want.size(), 2u);
  for (const std::string& other : std::vector<std::string>{saving.folder(), dir + "/waves/step-00000002"}) {
    const auto got = folder_files(other);
    ASSERT_EQ(got.size(), want.size()) << other;
    for (const auto& [name, bytes] : want) EXPECT_TRUE(got.count(name) && got.at(name) == bytes) << other << "/" << name;
  }
  EXPECT_EQ(fsdp::latest_checkpoint(dir + "/async"), saving.folder());
  expect_bitwise_equal(loaded_state(saving.folder()), run.state(), "loaded");
  remove_shared(dir);
}

TEST(AsyncSave, TrainingGoesOnWhileItWritesAndTheStepsStateIsSaved) {
  Trained run(kSavedStep);
  const auto at_save = run.state();
  const std::string dir = shared_folder("async-save", "training");
  std::promise<void> trained;
  std::shared_future<void> release = trained.get_future().share();
  fsdp::SaveHooks hooks;
  hooks.before_shard_files = [release] { release.wait(); };  // the write starts after 3 more steps
  auto saving = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir, kSavedStep, {}, 0,
                                            fsdp::AsyncSaveOptions().hooks(hooks));
  run.train(kSavedStep, kSavedStep + 3);
  const bool done_while_held = saving.done();
  trained.set_value();
  saving.wait();
  EXPECT_FALSE(done_while_held) << "the write ran before training went on: the test proves nothing";
  const auto after = run.state();
  EXPECT_FALSE(torch::equal(after.front().second, at_save.front().second)) << "training changed nothing";
  expect_bitwise_equal(loaded_state(saving.folder()), at_save, "the saved step's state");
  remove_shared(dir);
}

TEST(AsyncSave, AWriteErrorComesFromWaitOnEveryRankNamingTheFolder) {
  Trained run(kSavedStep);
  const std::string dir = shared_folder("async-save", "error");
  fsdp::save_checkpoint(run.model, *run.optimizer, dir, 1);
  // Folders where the shard files would go: their renames fail (as root too, unlike permissions).
  const std::string folder = dir + "/step-00000002";
  if (dist().rank() == 0) {
    for (int shard = 0; shard < dist().world_size(); ++shard) {
      for (int parts = 1; parts <= 3; ++parts) {
        for (int part = 1; part <= parts; ++part) {
          char name[64];
          std::snprintf(name, sizeof name, "/shard-%05d-model-%05d-of-%05d.safetensors/x", shard, part, parts);
          fs::create_directories(folder + name);
        }
      }
    }
  }
  barrier();
  auto saving = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir, kSavedStep);
  const std::string error = error_of([&] { saving.wait(); });
  EXPECT_NE(error.find("cannot write " + folder), std::string::npos) << error;
  EXPECT_NE(error_of([&] { saving.wait(); }), "") << "a second wait() forgets the error";
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000001") << "the failed save was published";
  remove_shared(dir);
}

TEST(AsyncSave, TheNextSaveCompletesThePreviousOne) {
  Trained run(kSavedStep);
  const std::string dir = shared_folder("async-save", "next");
  auto first = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir, kSavedStep);
  run.train(kSavedStep, kSavedStep + 1);
  fsdp::save_checkpoint(run.model, *run.optimizer, dir, kSavedStep + 1, {}, /*keep_last=*/2);
  EXPECT_TRUE(first.done());
  EXPECT_TRUE(fs::exists(first.folder() + "/metadata.json"));
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000003");
  first.wait();  // completed already: returns at once, no collective
  remove_shared(dir);
}

// [Note: the staging arena is kept]: a reservation made once the optimizer has its state is the
// arena the first save stages in; one made before (AdamW makes its moments at the first step)
// does not fit, and the save makes its own.
TEST(AsyncSave, AReservedArenaIsTheOneTheFirstSaveStagesIn) {
  const std::string dir = shared_folder("async-save", "reserved");
  // Keeps an arena without the moments: whatever an earlier test left, not what a save needs.
  const auto reserve_before_the_first_step = [] {
    Trained untrained(0);
    fsdp::reserve_staging_arena(untrained.model, *untrained.optimizer);
  };
  reserve_before_the_first_step();
  Trained run(kSavedStep);
  auto unfit = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir + "/unfit", kSavedStep);
  unfit.wait();
  EXPECT_FALSE(unfit.reused_arena()) << "an arena without the optimizer's moments held them";
  reserve_before_the_first_step();
  fsdp::reserve_staging_arena(run.model, *run.optimizer);
  auto first = fsdp::save_checkpoint_async(run.model, *run.optimizer, dir + "/reserved", kSavedStep);
  first.wait();
  EXPECT_TRUE(first.reused_arena()) << "the first save after a reservation made its own arena";
  expect_bitwise_equal(loaded_state(first.folder()), run.state(), "loaded");
  remove_shared(dir);
}

TEST(AsyncSave, ABudgetBelowOneShardFileIsRefusedNamingBothSizes) {
  Trained run(kSavedStep);
  const std::string dir = shared_folder("async-save", "budget");
  const std::string error = error_of([&] {
    fsdp::save_checkpoint_async(run.model, *run.optimizer, dir, kSavedStep, {}, 0,
                                fsdp::AsyncSaveOptions().staging_budget_bytes(8));
  });
  EXPECT_NE(error.find("more than the staging budget of 8 bytes"), std::string::npos) << error;
  EXPECT_EQ(fsdp::latest_checkpoint(dir), "");
  remove_shared(dir);
}

}  // namespace
}  // namespace fsdp_test
