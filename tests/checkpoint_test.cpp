// Sharded checkpoints over real ranks: save -> load gives back the same parameters and AdamW state;
// resuming is bitwise; a bad checkpoint throws the same named error on every rank and changes
// nothing; an interrupted save leaves the previous checkpoint the one that loads. Loading on
// another world size is tested by tests/checkpoint_e2e.py (it needs new processes).
#include "dist_env.h"
#include "test_corpus.h"

#include "data.h"
#include "gpt.h"

#include <fsdp/checkpoint.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <stdexcept>
#include <unistd.h>

namespace fsdp_test {
namespace {

namespace fs = std::filesystem;

// Every rank waits here until all have arrived (rank 0 prepares files between two of these).
void barrier() {
  auto t = torch::zeros({1});
  fsdp::all_reduce_sum(*dist().world, t);
}

// A folder under /tmp that every rank of this test names alike (rank 0's pid, the test, the world
// size); rank 0 removes it at the end.
class SharedTempDir {
 public:
  SharedTempDir() {
    auto pid = torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong);
    fsdp::broadcast(*dist().world, pid, 0);
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = "/tmp/fsdp-checkpoint-test-" + std::to_string(pid.item<int64_t>()) + "-w" +
            std::to_string(dist().world_size()) + "-" + test->name();
    if (dist().rank() == 0) fs::create_directories(path_);
    barrier();
  }
  ~SharedTempDir() {
    barrier();
    if (dist().rank() == 0) fs::remove_all(path_);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The name of shard `shard`'s first safetensors file in `folder`.
std::string first_file_of_shard(const std::string& folder, int shard) {
  char prefix[64];
  std::snprintf(prefix, sizeof prefix, "shard-%05d-model-00001-of-", shard);
  for (const auto& item : fs::directory_iterator(folder)) {
    const std::string name = item.path().filename().string();
    if (name.rfind(prefix, 0) == 0) return name;
  }
  ADD_FAILURE() << folder << " has no file " << prefix << "*";
  return "";
}

gpt::GPTConfig small_config() {
  return gpt::GPTConfig::sized(/*layers=*/2, /*dim=*/32, /*heads=*/2, /*max_seq=*/16);
}

constexpr int64_t kBatch = 2;  // rows per rank
constexpr uint64_t kDataSeed = 7;

// A sharded GPT and its AdamW, as a fresh process would build them.
struct Training {
  explicit Training(uint64_t init_seed, gpt::GPTConfig config = small_config(),
               fsdp::FullyShardOptions options = {}, bool fused_optimizer = true)
      : gpt(gpt::make_gpt(config, init_seed)),
        optim(gpt::make_optimizer(gpt, 3e-3, 0.1, fused_optimizer)),
        model(fsdp::fully_shard(gpt, *dist().world, options)) {}

  // Trains steps [first, last) on the global batches of kDataSeed; returns the global losses.
  std::vector<double> train(int64_t first, int64_t last) {
    std::vector<double> losses;
    for (int64_t step = first; step < last; ++step) {
      auto [x, y] = test_corpus().batch(kDataSeed, step, dist().rank() * kBatch, kBatch,
                                   gpt->config.max_seq);
      optim->zero_grad();
      auto loss = gpt::lm_loss(model(x), y);
      loss.backward();
      optim->step();
      auto global = loss.detach().clone();
      fsdp::all_reduce_sum(*dist().world, global);
      losses.push_back(global.item<double>() / dist().world_size());
    }
    return losses;
  }

  fsdp::NamedTensors params() { return fsdp::gather_full_params(model); }
  fsdp::NamedTensors optimizer_state() { return fsdp::gather_full_optimizer_state(model, *optim); }

  gpt::GPT gpt;
  std::unique_ptr<torch::optim::AdamW> optim;
  fsdp::Unit<gpt::GPT> model;
};

void expect_bitwise_equal(const fsdp::NamedTensors& a, const fsdp::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  std::map<std::string, torch::Tensor> by_name(b.begin(), b.end());
  for (const auto& [name, tensor] : a) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, by_name.at(name))) << name;
  }
}

TEST(Checkpoint, SaveLoadGivesTheSameParametersAndOptimizerState) {
  SharedTempDir tmp;
  Training saved(1);
  saved.train(0, 3);
  fsdp::save_sharded(saved.model, *saved.optim, tmp / "ckpt", {{"step", 3}, {"note", "hello"}});

  Training loaded(2);  // another initialisation: everything must come from the checkpoint
  const auto extra = fsdp::load_sharded(loaded.model, *loaded.optim, tmp / "ckpt");
  EXPECT_EQ(extra.at("step").get<int64_t>(), 3);
  EXPECT_EQ(extra.at("note").get<std::string>(), "hello");
  expect_bitwise_equal(loaded.params(), saved.params());
  const auto state = saved.optimizer_state();
  EXPECT_EQ(state.size(), 3 * saved.params().size());  // exp_avg, exp_avg_sq, step
  expect_bitwise_equal(loaded.optimizer_state(), state);
}

// Both AdamWs keep the same state (names, moments, step), so a checkpoint saved with one resumes
// with the other: the state loads bitwise, and the resumed losses are the uninterrupted run's to
// fp32 rounding (the two compute the same update in different kernels).
TEST(Checkpoint, ACheckpointOfOneAdamWResumesWithTheOther) {
  for (const bool saved_fused : {false, true}) {
    SharedTempDir tmp;
    const auto expected = Training(1, small_config(), {}, saved_fused).train(0, 8);
    Training first(1, small_config(), {}, saved_fused);
    first.train(0, 4);
    fsdp::save_sharded(first.model, *first.optim, tmp / "ckpt", {{"step", 4}});
    Training resumed(2, small_config(), {}, !saved_fused);
    fsdp::load_sharded(resumed.model, *resumed.optim, tmp / "ckpt");
    expect_bitwise_equal(resumed.optimizer_state(), first.optimizer_state());
    const auto losses = resumed.train(4, 8);
    for (size_t k = 0; k < losses.size(); ++k) {
      EXPECT_NEAR(losses[k], expected[4 + k], 1e-5 * std::abs(expected[4 + k]))
          << "step " << 4 + k << ", saved with " << (saved_fused ? "fused" : "LibTorch's") << " AdamW";
    }
  }
}

TEST(Checkpoint, ResumeGivesBitwiseTheLossesOfAnUninterruptedRun) {
  SharedTempDir tmp;
  const auto straight = Training(1).train(0, 20);

  std::vector<double> resumed;
  {
    Training first(1);
    resumed = first.train(0, 10);
    fsdp::save_checkpoint(first.model, *first.optim, tmp / "ckpt", 10, {{"step", 10}});
  }  // the first "process" ends
  Training second(99);
  const std::string path = fsdp::latest_checkpoint(tmp / "ckpt");
  EXPECT_EQ(path, tmp / "ckpt/step-00000010");
  const int64_t step = fsdp::load_sharded(second.model, *second.optim, path).at("step");
  ASSERT_EQ(step, 10);
  const auto rest = second.train(step, 20);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, straight);  // bitwise
}

TEST(Checkpoint, LoadsUnderAnotherShardingStrategy) {
  if (dist().world_size() < 2) GTEST_SKIP() << "one rank: every strategy has the same layout";
  SharedTempDir tmp;
  const auto no_shard = fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::NoShard);
  Training full(1);
  full.train(0, 3);
  fsdp::save_sharded(full.model, *full.optim, tmp / "full_shard");
  Training replicated(2, small_config(), no_shard);  // every rank holds whole parameters
  fsdp::load_sharded(replicated.model, *replicated.optim, tmp / "full_shard");
  expect_bitwise_equal(replicated.params(), full.params());
  expect_bitwise_equal(replicated.optimizer_state(), full.optimizer_state());

  replicated.train(3, 4);
  fsdp::save_sharded(replicated.model, *replicated.optim, tmp / "no_shard");  // one file
  Training sharded(3);
  fsdp::load_sharded(sharded.model, *sharded.optim, tmp / "no_shard");
  expect_bitwise_equal(sharded.params(), replicated.params());
  expect_bitwise_equal(sharded.optimizer_state(), replicated.optimizer_state());
}

// The parameters and optimizer state, to prove that a failed load changed nothing.
struct Snapshot {
  explicit Snapshot(Training& run) : params(run.params()), state(run.optimizer_state()) {}
  fsdp::NamedTensors params, state;
};

// Loading `folder` throws on every rank with every one of `parts` in the message, and leaves
// `run` as it was.
void expect_load_fails(Training& run, const std::string& folder, const std::vector<std::string>& parts) {
  const Snapshot before(run);
  try {
    fsdp::load_sharded(run.model, *run.optim, folder);
    ADD_FAILURE() << "loading " << folder << " did not throw";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
  const Snapshot after(run);
  expect_bitwise_equal(after.params, before.params);
  expect_bitwise_equal(after.state, before.state);
}

// Rank 0 copies the good checkpoint to `name` and spoils it with `spoil(folder)`.
std::string spoiled_copy(const SharedTempDir& tmp, const std::string& name,
                         const std::function<void(const std::string&)>& spoil) {
  const std::string folder = tmp / name;
  if (dist().rank() == 0) {
    fs::copy(tmp / "good", folder, fs::copy_options::recursive);
    spoil(folder);
  }
  barrier();
  return folder;
}

TEST(Checkpoint, BadFilesGiveTheNamedErrorOnEveryRankAndChangeNothing) {
  SharedTempDir tmp;
  const int world = dist().world_size();
  Training saved(1);
  saved.train(0, 2);
  fsdp::save_sharded(saved.model, *saved.optim, tmp / "good");
  const std::string last_shard = first_file_of_shard(tmp / "good", world - 1);
  Training other_layers(1, [] { auto c = small_config(); c.layers = 3; return c; }());
  fsdp::save_sharded(other_layers.model, *other_layers.optim, tmp / "other_model");
  Training other_width(1, [] { auto c = small_config(); c.dim = 48; return c; }());
  fsdp::save_sharded(other_width.model, *other_width.optim, tmp / "other_shape");

  Training run(2);
  run.train(0, 1);  // has optimizer state of its own, which must survive
  const std::string truncated = spoiled_copy(tmp, "truncated", [&](const std::string& f) {
    fs::resize_file(f + "/" + last_shard, fs::file_size(f + "/" + last_shard) / 2);
  });
  expect_load_fails(run, truncated, {last_shard, "truncated", "rank " + std::to_string(world - 1)});

  const std::string corrupt = spoiled_copy(tmp, "corrupt", [&](const std::string& f) {
    std::fstream file(f + "/" + last_shard, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(f + "/" + last_shard) / 2);
    file.seekg(middle);
    const char byte = static_cast<char>(file.get());
    file.seekp(middle);
    file.put(static_cast<char>(~byte));  // one byte of the tensor data, flipped
  });
  expect_load_fails(run, corrupt, {last_shard, "CRC-32", "corrupt"});

  const std::string missing = spoiled_copy(
      tmp, "missing", [&](const std::string& f) { fs::remove(f + "/" + last_shard); });
  expect_load_fails(run, missing, {last_shard, "cannot open", "missing"});

  expect_load_fails(run, tmp / "other_model",
                    {"metadata.json", "parameter 'h.2.", "that the model does not have"});
  expect_load_fails(run, tmp / "other_shape",
                    {"metadata.json", "'wte.weight' has shape [256, 48] but the model's is [256, 32]"});

  const std::string incomplete = spoiled_copy(
      tmp, "incomplete", [&](const std::string& f) { fs::remove(f + "/metadata.json"); });
  expect_load_fails(run, incomplete, {"metadata.json", "not a complete checkpoint"});

  const std::string garbled = spoiled_copy(tmp, "garbled", [&](const std::string& f) {
    fs::resize_file(f + "/metadata.json", fs::file_size(f + "/metadata.json") - 10);
  });
  expect_load_fails(run, garbled, {"metadata.json", "malformed"});
}

TEST(Checkpoint, InterruptedSaveLeavesThePreviousCheckpointTheOneThatLoads) {
  SharedTempDir tmp;
  const std::string dir = tmp / "ckpt";
  Training run(1);
  run.train(0, 2);
  fsdp::save_checkpoint(run.model, *run.optim, dir, 2, {{"step", 2}});
  const Snapshot at_step_2(run);
  run.train(2, 4);
  // A save of step 4 killed after the shard files, before its metadata and the pointer.
  fsdp::save_sharded(run.model, *run.optim, dir + "/step-00000004", {{"step", 4}});
  if (dist().rank() == 0) {
    fs::remove(dir + "/step-00000004/metadata.json");
    std::ofstream(dir + "/step-00000004/shard-00000-model-00001-of-00003.safetensors.tmp.123") << "partial";
  }
  barrier();
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000002");

  Training resumed(5);
  EXPECT_EQ(fsdp::load_sharded(resumed.model, *resumed.optim, fsdp::latest_checkpoint(dir))
                .at("step")
                .get<int64_t>(),
            2);
  expect_bitwise_equal(resumed.params(), at_step_2.params);
  expect_bitwise_equal(resumed.optimizer_state(), at_step_2.state);

  // The same step saved again would overwrite the only complete checkpoint: refused.
  EXPECT_THROW(fsdp::save_checkpoint(run.model, *run.optim, dir, 2), c10::Error);
  // The next complete save is published, and keep_last prunes the older folders.
  fsdp::save_checkpoint(run.model, *run.optim, dir, 6, {{"step", 6}}, /*keep_last=*/1);
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000006");
  barrier();
  EXPECT_FALSE(fs::exists(dir + "/step-00000002"));
  EXPECT_FALSE(fs::exists(dir + "/step-00000004"));
}

TEST(Checkpoint, SaveHooksRunBetweenTheShardFilesAndTheMetadata) {
  SharedTempDir tmp;
  const std::string dir = tmp / "ckpt";
  Training run(1);
  run.train(0, 1);
  fsdp::save_checkpoint(run.model, *run.optim, dir, 1, {{"step", 1}});
  int calls = 0;
  fsdp::SaveHooks hooks;
  hooks.after_shard_files = [&] {
    ++calls;
    const std::string folder = dir + "/step-00000002";
    EXPECT_TRUE(fs::exists(folder + "/" + first_file_of_shard(folder, dist().rank())));
    EXPECT_FALSE(fs::exists(folder + "/metadata.json"));
    EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000001");
  };
  fsdp::save_checkpoint(run.model, *run.optim, dir, 2, {{"step", 2}}, 0, hooks);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000002");

  // A save that fails there (on one rank) fails on every rank and publishes nothing.
  hooks.after_shard_files = [] {
    if (dist().rank() == dist().world_size() - 1) throw std::runtime_error("stopped by the test");
  };
  try {
    fsdp::save_checkpoint(run.model, *run.optim, dir, 3, {{"step", 3}}, 0, hooks);
    ADD_FAILURE() << "the save did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopped by the test"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/step-00000003/metadata.json"));
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000002");
}

TEST(Checkpoint, NoPointerMeansNoCheckpointOrTheNewestComplete) {
  SharedTempDir tmp;
  EXPECT_EQ(fsdp::latest_checkpoint(tmp / "absent"), "");
  Training run(1);
  run.train(0, 1);
  fsdp::save_sharded(run.model, *run.optim, tmp / "ckpt/step-00000001");
  fsdp::save_sharded(run.model, *run.optim, tmp / "ckpt/step-00000003");
  if (dist().rank() == 0) fs::remove(tmp / "ckpt/step-00000003/metadata.json");
  barrier();
  EXPECT_EQ(fsdp::latest_checkpoint(tmp / "ckpt"), tmp / "ckpt/step-00000001");
}

}  // namespace
}  // namespace fsdp_test
