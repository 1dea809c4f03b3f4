// Memory and communication per rank, measured with the counting allocator and the byte counters,
// against bounds computed from the units' sizes (model_sizes.h), each stated where it is checked.
#include "dist_env.h"
#include "test_corpus.h"
#include "model_sizes.h"

#include "data.h"
#include "gpt.h"

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

gpt::GPTConfig small_gpt() {
  return gpt::GPTConfig::sized(/*layers=*/4, /*dim=*/64, /*heads=*/4, /*max_seq=*/32);
}

std::pair<torch::Tensor, torch::Tensor> local_batch(int64_t step, int64_t batch, int64_t seq) {
  return test_corpus().batch(/*seed=*/9, step, dist().rank() * batch, batch, seq);
}


TEST(Accounting, PersistentStateAfterAStepIsOneWthOfTheModel) {
  const auto config = small_gpt();
  test_corpus();  // loaded before measuring: it is not the model's memory
  const int64_t before = fsdp::memory_stats().current_bytes;
  auto gpt_model = gpt::make_gpt(config, 1);
  int64_t model_numel = 0;
  for (auto& p : gpt_model->parameters()) model_numel += p.numel();
  auto optimizer = gpt::make_optimizer(gpt_model, 1e-3, 0.1);
  auto model = fsdp::fully_shard(gpt_model, *dist().world);

  int64_t shard_numel = 0, local_numel = 0;
  for (const auto& unit : model.units()) shard_numel += unit.shard_numel;
  for (auto& p : model->parameters()) local_numel += p.numel();
  const int64_t after_shard = fsdp::memory_stats().current_bytes - before;
  EXPECT_EQ(after_shard, 4 * shard_numel);  // exactly the fp32 shards, nothing unsharded left

  {
    auto [x, y] = local_batch(0, 2, config.max_seq);
    optimizer->zero_grad();
    gpt::lm_loss(model(x), y).backward();
    optimizer->step();
  }
  // fp32 parameter and gradient shards (padded) + AdamW's two moments of the local pieces.
  const int64_t expected = 4 * shard_numel + 4 * shard_numel + 8 * local_numel;
  const int64_t measured = fsdp::memory_stats().current_bytes - before;
  std::printf("persistent bytes per rank: measured %lld, expected %lld, unsharded model %lld (x%.3f)\n",
              (long long)measured, (long long)expected, (long long)(16 * model_numel),
              double(measured) / (16.0 * model_numel));
  EXPECT_GE(measured, expected);
  EXPECT_LE(measured, expected + 4096);  // + AdamW's per-parameter step counters and bookkeeping
  EXPECT_LE(measured, 16.0 * model_numel / dist().world_size() + 16.0 * 4 * model.units().size());
}

TEST(Accounting, ForwardHoldsNoUnshardedUnitBeyondTheBound) {
  const auto config = small_gpt();
  auto [x, y] = local_batch(1, 2, config.max_seq);

  // Activations of the same forward without sharding: the part of the bound that is not FSDP's.
  auto reference = gpt::make_gpt(config, 2);
  fsdp::reset_peak_memory();
  int64_t start = fsdp::memory_stats().current_bytes;
  auto reference_logits = reference(x);
  const int64_t reference_peak = fsdp::memory_stats().peak_bytes - start;
  const int64_t reference_kept = fsdp::memory_stats().current_bytes - start;
  reference_logits = torch::Tensor();

  auto model = fsdp::fully_shard(gpt::make_gpt(config, 2), *dist().world);
  int64_t root_full = 0, largest_unit_full = 0, smallest_unit_full = INT64_MAX;
  for (const auto& unit : model.units()) {
    const int64_t full = unit.unsharded_bytes;
    if (unit.is_root) {
      root_full = full;
    } else {
      largest_unit_full = std::max(largest_unit_full, full);
      smallest_unit_full = std::min(smallest_unit_full, full);
    }
  }
  fsdp::reset_peak_memory();
  start = fsdp::memory_stats().current_bytes;
  auto logits = model(x);
  const int64_t peak = fsdp::memory_stats().peak_bytes - start;
  const int64_t kept = fsdp::memory_stats().current_bytes - start;
  const int64_t bound = root_full + 2 * largest_unit_full + reference_peak;
  std::printf("forward: peak %lld above the sharded state, bound %lld; kept %lld (root %lld + "
              "activations %lld)\n", (long long)peak, (long long)bound, (long long)kept,
              (long long)root_full, (long long)reference_kept);
  EXPECT_LE(peak, bound);
  // [Note: storage reuse]: after forward only the root stays unsharded; the blocks' buffers are
  // freed although autograd still holds views of them.
  EXPECT_LT(kept, root_full + reference_kept + smallest_unit_full / 2);
  gpt::lm_loss(logits, y).backward();
}

// The rate limiter bounds backward's unsharded memory, whatever the prefetch policy: at most K
// units hold unsharded parameters, plus the gradient backward is accumulating and one more
// waiting for its reduce-scatter ([Note: rate limiter slots]). Wide layers on one input row make the
// activations negligible, so the counting allocator sees the unsharded buffers themselves.
TEST(Accounting, RateLimiterBoundsBackwardMemory) {
  constexpr int64_t kWidth = 256, kBlocks = 6;
  const int64_t unit_full = kWidth * (kWidth + 1) * 4;  // one Linear's parameters (or gradients)
  const int64_t slack = 64 << 10;  // activations of one row, their gradients, bookkeeping
  for (int limit : {1, 2, 3}) {
    for (auto prefetch : {fsdp::BackwardPrefetch::BackwardPre, fsdp::BackwardPrefetch::BackwardPost}) {
      torch::manual_seed(0);
      torch::nn::Sequential net;
      for (int i = 0; i < kBlocks; ++i) net->push_back(torch::nn::Linear(kWidth, kWidth));
      fsdp::wrap_blocks<torch::nn::Linear>(net);
      auto options = fsdp::FullyShardOptions().limit_all_gathers(limit).backward_prefetch(prefetch);
      auto model = fsdp::fully_shard(net, *dist().world, options);
      int64_t shard_bytes = 0;
      for (const auto& unit : model.units()) shard_bytes += unit.shard_bytes;

      auto loss = model(torch::ones({1, kWidth})).sum();
      fsdp::reset_peak_memory();
      const int64_t start = fsdp::memory_stats().current_bytes;
      loss.backward();
      const int64_t peak = fsdp::memory_stats().peak_bytes - start;
      // K units' parameters, two units' gradients, the gradient shards (kept) and the
      // reduce-scatter's temporaries (a receive buffer at W > 2).
      const int64_t bound = (limit + 2) * unit_full + shard_bytes + unit_full + slack;
      std::printf("backward, limit %d, prefetch %s: peak %lld above its start, bound %lld (one "
                  "unit's parameters: %lld)\n", limit, fsdp::to_string(prefetch), (long long)peak,
                  (long long)bound, (long long)unit_full);
      EXPECT_LE(peak, bound) << "limit " << limit << " prefetch " << fsdp::to_string(prefetch);
    }
  }
}

// At W = 1, where the shard is the whole unit, gradients go straight into the gradient shards:
// backward then holds the gradient autograd hands over and the shards, and no unsharded gradient
// at all. In fp32, so that no CPU's matmul kernels (bf16 ones convert through fp32 temporaries
// on CPUs without native bf16) add to what the counting allocator sees. The layout of
// RateLimiterBoundsBackwardMemory.
TEST(Accounting, BackwardHoldsNoUnshardedGradientAtW1) {
  constexpr int64_t kWidth = 256, kBlocks = 6;
  const int64_t unit = kWidth * (kWidth + 1) * 4;  // one Linear's parameters (or gradients)
  const int64_t slack = 64 << 10;
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < kBlocks; ++i) net->push_back(torch::nn::Linear(kWidth, kWidth));
  fsdp::wrap_blocks<torch::nn::Linear>(net);
  auto model = fsdp::fully_shard(net, *dist().world, fsdp::FullyShardOptions().limit_all_gathers(1));
  int64_t grad_shard_bytes = 0;
  for (const auto& unit_info : model.units()) grad_shard_bytes += unit_info.shard_numel * 4;

  auto loss = model(torch::ones({1, kWidth})).sum();
  fsdp::reset_peak_memory();
  const int64_t start = fsdp::memory_stats().current_bytes;
  loss.backward();
  const int64_t peak = fsdp::memory_stats().peak_bytes - start;
  // W = 1: the gradient autograd hands over (until it is copied) and the gradient shards (the
  // parameters are their shards). W > 1 besides: one unit's unsharded parameters, two unsharded
  // gradients in flight and the reduce-scatter's receive buffer. An unsharded gradient at W = 1
  // would add a unit or two.
  const int64_t more = dist().world_size() == 1 ? 0 : unit + 2 * unit + unit;
  const int64_t bound = unit + more + grad_shard_bytes + slack;
  std::printf("backward at W = %d: peak %lld above its start, bound %lld (a unit: %lld)\n",
              dist().world_size(), (long long)peak, (long long)bound, (long long)unit);
  EXPECT_LE(peak, bound);
}

TEST(Accounting, BytesPerStepMatchTheRingFormulas) {
  const auto config = small_gpt();
  auto model = fsdp::fully_shard(gpt::make_gpt(config, 3), *dist().world);
  const int64_t w = dist().world_size();
  // From the model's parameter counts (padded to a multiple of W), not the library's unit sizes.
  const auto numels = gpt_unit_numels(config);
  ASSERT_EQ(model.units().size(), numels.size());
  int64_t expected_all_gather = 0, expected_reduce_scatter = 0;
  for (const auto& [unit, numel] : numels) {
    const int64_t ring = (w - 1) * 4 * shard_elements(numel, w);  // W-1 fp32 shards sent per pass
    expected_all_gather += unit.empty() ? ring : 2 * ring;  // blocks: forward and backward
    expected_reduce_scatter += ring;
  }
  auto [x, y] = local_batch(2, 2, config.max_seq);
  const auto before = fsdp::comm_stats();
  gpt::lm_loss(model(x), y).backward();
  const auto after = fsdp::comm_stats();
  EXPECT_EQ(after.all_gather_bytes - before.all_gather_bytes, expected_all_gather);
  EXPECT_EQ(after.reduce_scatter_bytes - before.reduce_scatter_bytes, expected_reduce_scatter);
  EXPECT_EQ(after.all_reduce_bytes - before.all_reduce_bytes, 0);
  std::printf("bytes per step: all-gather %lld, reduce-scatter %lld\n",
              (long long)expected_all_gather, (long long)expected_reduce_scatter);
}

// [Note: gradient shards live as long as the gradients]: zero_grad (set_to_none, LibTorch's
// default) leaves nothing holding the gradient shards, so the next forward runs without them; a
// zero_grad that zeroes in place keeps them. With either optimizer gpt_train uses.
TEST(Accounting, GradientShardsAreFreedWhenTheOptimizerClearsTheGradients) {
  const auto config = small_gpt();
  test_corpus();
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fsdp::optim::AdamW" : "torch::optim::AdamW");
    const int64_t before = fsdp::memory_stats().current_bytes;
    auto gpt_model = gpt::make_gpt(config, 4);
    auto optimizer = gpt::make_optimizer(gpt_model, 1e-3, 0.1, fused);
    auto model = fsdp::fully_shard(gpt_model, *dist().world);
    int64_t shard_numel = 0, local_numel = 0;
    for (const auto& unit : model.units()) shard_numel += unit.shard_numel;
    for (auto& p : model->parameters()) local_numel += p.numel();
    auto [x, y] = local_batch(4, 2, config.max_seq);
    const auto train_step = [&] {
      optimizer->zero_grad();
      gpt::lm_loss(model(x), y).backward();
      optimizer->step();
    };
    const auto forward_without_grad = [&] {
      torch::NoGradGuard no_grad;
      model(x);
    };
    const auto held = [&] { return fsdp::memory_stats().current_bytes - before; };
    constexpr int64_t kBookkeeping = 4096;  // AdamW's step counters and the like
    const int64_t with_grads = 4 * shard_numel + 4 * shard_numel + 8 * local_numel;
    const int64_t without_grads = with_grads - 4 * shard_numel;

    train_step();
    EXPECT_GE(held(), with_grads);
    EXPECT_LE(held(), with_grads + kBookkeeping);
    optimizer->zero_grad(/*set_to_none=*/false);  // zeroed in place: still the optimizer's
    forward_without_grad();
    EXPECT_GE(held(), with_grads);
    for (auto& p : model->parameters()) ASSERT_TRUE(p.grad().defined());
    optimizer->zero_grad();  // cleared: the next forward drops the shards
    forward_without_grad();
    std::printf("%s: held after zero_grad and a forward %lld, model states with gradients %lld\n",
                fused ? "fused AdamW" : "LibTorch's AdamW", (long long)held(), (long long)with_grads);
    EXPECT_GE(held(), without_grads);
    EXPECT_LE(held(), without_grads + kBookkeeping);
    train_step();  // backward allocates them again
    EXPECT_GE(held(), with_grads);
    EXPECT_LE(held(), with_grads + kBookkeeping);
  }
}

// [Note: gradient views made once]: after zero_grad (set_to_none) the next backward hands the
// same gradient tensors out again, refilled; a gradient the program kept keeps its values, and
// its parameter gets a new tensor. Weak references watch the tensors without holding them (a
// freed TensorImpl's address could come back otherwise).
TEST(Accounting, GradientTensorsAreHandedOutAgainUnlessTheProgramKeptOne) {
  const auto config = small_gpt();
  test_corpus();
  auto gpt_model = gpt::make_gpt(config, 5);
  auto optimizer = gpt::make_optimizer(gpt_model, 1e-3, 0.1, /*fused=*/true);
  auto model = fsdp::fully_shard(gpt_model, *dist().world);
  auto [x, y] = local_batch(4, 2, config.max_seq);
  const auto train_step = [&] {
    optimizer->zero_grad();
    gpt::lm_loss(model(x), y).backward();
    optimizer->step();
  };
  const auto params = model->parameters();
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl>;
  const auto watch = [&] {
    std::vector<WeakImpl> grads;
    for (const auto& p : params) grads.emplace_back(p.grad().getIntrusivePtr());
    return grads;
  };
  const auto same = [](const WeakImpl& before, const at::Tensor& now) {
    return !before.expired() && before._unsafe_get_target() == now.unsafeGetTensorImpl();
  };
  train_step();
  const auto first = watch();
  train_step();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(same(first[i], params[i].grad())) << i;

  size_t k = 0;  // a parameter with elements in this rank's shard
  while (params[k].numel() == 0) ++k;
  const at::Tensor kept = params[k].grad();
  const at::Tensor kept_values = kept.clone();
  const auto second = watch();
  train_step();
  EXPECT_TRUE(torch::equal(kept, kept_values)) << "a gradient the program kept was overwritten";
  EXPECT_FALSE(same(second[k], params[k].grad()));
  EXPECT_FALSE(torch::equal(params[k].grad(), kept_values));  // the new step's gradient
  size_t handed_out_again = 0;
  for (size_t i = 0; i < params.size(); ++i) handed_out_again += same(second[i], params[i].grad());
  EXPECT_GT(handed_out_again, params.size() / 2);  // the other units' gradients

  // A tensor sharing a gradient's storage only (detach() holds no reference to the gradient
  // tensor itself) keeps its values too.
  size_t v = params.size() - 1;
  while (params[v].numel() == 0) --v;
  const at::Tensor kept_view = params[v].grad().detach();
  const at::Tensor view_values = kept_view.clone();
  train_step();
  EXPECT_TRUE(torch::equal(kept_view, view_values)) << "a view the program kept was overwritten";
  EXPECT_FALSE(torch::equal(params[v].grad(), view_values));
}

// Gradients the optimizer never cleared are added to, across steps, with no_sync in between:
// the no_sync backward clears the parameters' gradients while its sum waits unsharded, and the
// forward after it must not take that for zero_grad (the shard still holds the earlier sum).
TEST(Accounting, GradientsKeptAcrossNoSyncBackwardsAddUp) {
  const auto config = small_gpt();
  const int64_t w = dist().world_size(), batch = 2;
  auto model = fsdp::fully_shard(gpt::make_gpt(config, 5), *dist().world);
  auto reference = gpt::make_gpt(config, 5);
  for (int64_t micro = 0; micro < 3; ++micro) {
    auto [x, y] = local_batch(10 + micro, batch, config.max_seq);
    if (micro == 1) {
      fsdp::NoSyncGuard no_sync(model);
      gpt::lm_loss(model(x), y).backward();
    } else {
      gpt::lm_loss(model(x), y).backward();
    }
    auto [gx, gy] = test_corpus().batch(/*seed=*/9, 10 + micro, 0, w * batch, config.max_seq);
    gpt::lm_loss(reference(gx), gy).backward();  // the global mean: what the ranks average
  }
  {  // the gradient shards become the parameters: gather them whole
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      ASSERT_TRUE(p.grad().defined());
      p.copy_(p.grad());
    }
  }
  std::map<std::string, torch::Tensor> expected;
  for (auto& item : reference->named_parameters()) expected[item.key()] = item.value().grad();
  for (const auto& [name, g] : fsdp::gather_full_params(model)) {
    const auto& g_ref = expected.at(name);
    const double err = (g - g_ref).norm().item<double>(), size = g_ref.norm().item<double>();
    EXPECT_LE(err, 1e-4 * size + 1e-9) << name << ": |g - g_ref| = " << err << ", |g_ref| = " << size;
  }
}

// reshard_after_forward(false), for every unit or for one by name: a unit that keeps its
// parameters after forward is not gathered again in backward (one all-gather pass instead of
// two), and its gradients are bitwise the default's.
TEST(Accounting, ReshardAfterForwardFalseSkipsTheBackwardAllGather) {
  const auto config = small_gpt();
  const int64_t w = dist().world_size();
  const std::string last = "h." + std::to_string(config.layers - 1);
  auto [x, y] = local_batch(3, 2, config.max_seq);
  struct Step {
    int64_t all_gather_bytes;
    std::vector<torch::Tensor> grads;  // this rank's gradient shards
  };
  const auto step = [&](const fsdp::FullyShardOptions& options) {
    auto model = fsdp::fully_shard(gpt::make_gpt(config, 3), *dist().world, options);
    const auto before = fsdp::comm_stats();
    gpt::lm_loss(model(x), y).backward();
    Step out{fsdp::comm_stats().all_gather_bytes - before.all_gather_bytes, {}};
    for (auto& p : model->parameters()) out.grads.push_back(p.grad().clone());
    return out;
  };
  int64_t one_pass = 0, last_block = 0;
  for (const auto& [unit, numel] : gpt_unit_numels(config)) {
    const int64_t ring = (w - 1) * 4 * shard_elements(numel, w);
    one_pass += ring;
    if (unit == last) last_block = ring;
  }
  const int64_t root = (w - 1) * 4 * shard_elements(gpt_unit_numels(config).at(""), w);
  const Step by_default = step({});
  const Step kept = step(fsdp::FullyShardOptions().reshard_after_forward(false));
  const Step last_kept = step(fsdp::FullyShardOptions().reshard_after_forward_of(
      [&](const std::string& unit) -> std::optional<bool> {
        return unit == last ? std::optional<bool>(false) : std::nullopt;
      }));
  EXPECT_EQ(by_default.all_gather_bytes, 2 * one_pass - root);  // the root: forward only
  EXPECT_EQ(kept.all_gather_bytes, one_pass);
  EXPECT_EQ(last_kept.all_gather_bytes, 2 * one_pass - root - last_block);
  for (const Step* other : {&kept, &last_kept}) {
    ASSERT_EQ(other->grads.size(), by_default.grads.size());
    for (size_t i = 0; i < by_default.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(other->grads[i], by_default.grads[i])) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace fsdp_test
