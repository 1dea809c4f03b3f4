// LibTorch's own torch::nn::utils::clip_grad_norm_ on a sharded or tensor-parallel model clips
// each rank by the norm of its own pieces: named by a warning at the next forward ([Note:
// gradients scaled by each rank alone] in src/core/gradient_watch.cpp). fsdp::clip_grad_norm_,
// LibTorch's clip_grad_value_ (elementwise, right under sharding) and NO_SHARD (every rank holds
// the whole gradient, so LibTorch's norm is the true one) are not named.
#include "dist_env.h"
#include "test_models.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>

namespace fsdp_test {
namespace {

const char* const kWarning = "were scaled by a factor that differs across the ranks";

enum class Clip { LibTorchNorm, FsdpNorm, LibTorchValue };

void clip(const std::vector<torch::Tensor>& params, Clip how) {
  switch (how) {
    case Clip::LibTorchNorm: torch::nn::utils::clip_grad_norm_(params, 1e-3); return;
    case Clip::FsdpNorm: fsdp::clip_grad_norm_(params, 1e-3); return;
    case Clip::LibTorchValue: torch::nn::utils::clip_grad_value_(params, 1e-3); return;
  }
}

// A user's loop: three steps, each rank on its own rows, clipped `how`; then one more forward
// (the check runs as the next forward starts). What this rank printed meanwhile.
std::string printed_over_steps(const std::function<torch::Tensor(int step)>& loss_of_step,
                               const std::vector<torch::Tensor>& params, Clip how) {
  torch::optim::AdamW optim(params, torch::optim::AdamWOptions(1e-3));
  testing::internal::CaptureStderr();
  for (int step = 0; step < 3; ++step) {
    optim.zero_grad();
    loss_of_step(step).backward();
    clip(params, how);
    optim.step();
  }
  optim.zero_grad();
  { torch::NoGradGuard no_grad; loss_of_step(3); }
  return testing::internal::GetCapturedStderr();
}

std::string printed_by_odd_net(Clip how, fsdp::FullyShardOptions options = {}) {
  auto model = fsdp::fully_shard(make_odd_net(1), *dist().world, options);
  const int rank = dist().rank(), world = dist().world_size();
  return printed_over_steps(
      [&](int step) {
        auto [x, y] = odd_batch(step, 4 * world);
        return torch::mse_loss(model->forward(x.chunk(world)[rank]), y.chunk(world)[rank]);
      },
      model->parameters(), how);
}

bool named(const std::string& printed) { return printed.find(kWarning) != std::string::npos; }

}  // namespace

TEST(ClipCheck, LibTorchsClipGradNormOnAShardedModelIsNamedAtTheNextForward) {
  const int64_t checked_before = fsdp::comm_stats().check_bytes;
  const std::string printed = printed_by_odd_net(Clip::LibTorchNorm);
  // The check's all-reduces are counted apart from the per-step kinds (none at W = 1).
  EXPECT_EQ(fsdp::comm_stats().check_bytes > checked_before, dist().world_size() > 1);
  if (dist().world_size() == 1) {
    EXPECT_FALSE(named(printed)) << "one rank: LibTorch's norm is the true one\n" << printed;
  } else if (dist().rank() == 0) {
    EXPECT_TRUE(named(printed)) << printed;
    EXPECT_NE(printed.find("fsdp::clip_grad_norm_(model->parameters(), max_norm)"), std::string::npos) << printed;
    EXPECT_EQ(printed.find(kWarning), printed.rfind(kWarning)) << "warned more than once\n" << printed;
  } else {
    EXPECT_FALSE(named(printed)) << "only rank 0 warns\n" << printed;
  }
}

TEST(ClipCheck, FsdpClipGradNormAndLibTorchsClipGradValueAreNotNamed) {
  for (Clip how : {Clip::FsdpNorm, Clip::LibTorchValue}) {
    const std::string printed = printed_by_odd_net(how);
    EXPECT_FALSE(named(printed)) << (how == Clip::FsdpNorm ? "fsdp::clip_grad_norm_" : "clip_grad_value_")
                                 << "\n" << printed;
  }
}

TEST(ClipCheck, LibTorchsClipGradNormUnderNoShardIsRightAndNotNamed) {
  const int64_t checked_before = fsdp::comm_stats().check_bytes;
  const std::string printed =
      printed_by_odd_net(Clip::LibTorchNorm, fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::NoShard));
  EXPECT_FALSE(named(printed)) << printed;
  EXPECT_EQ(fsdp::comm_stats().check_bytes, checked_before) << "whole gradients on every rank: nothing compared";
}

TEST(ClipCheck, LibTorchsClipGradNormUnderHybridShardIsNamedOnce) {
  const int world = dist().world_size();
  if (world < 4 || world % 2 != 0) GTEST_SKIP() << "needs 2 replicas of shard groups of W / 2 >= 2";
  const std::string printed = printed_by_odd_net(
      Clip::LibTorchNorm,
      fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::HybridShard).shard_group_size(world / 2));
  EXPECT_EQ(named(printed), dist().rank() == 0) << printed;
}

TEST(ClipCheck, LibTorchsClipGradNormOnATensorParallelModelIsNamed) {
  const int world = dist().world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even world: (dp, tp) = (W / 2, 2)";
  fsdp::DeviceMesh mesh(dist().world, {{"dp", world / 2}, {"tp", 2}});
  TinyLm split = seeded_model();
  split->tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  fsdp::tp::parallelize_module(*split, split->tp, tiny_plan());
  auto model = fsdp::fully_shard(split, mesh.group("dp"));
  const std::string printed = printed_over_steps(
      [&](int step) {
        torch::manual_seed(10 * step + mesh.coordinate("dp"));  // each dp rank its own rows
        const auto ids = torch::randint(kVocab, {2, kSeq}, torch::kLong);
        return model->loss(model->forward(ids), torch::roll(ids, 1, 1));
      },
      model->parameters(), Clip::LibTorchNorm);
  EXPECT_EQ(named(printed), dist().rank() == 0) << printed;
}

}  // namespace fsdp_test
