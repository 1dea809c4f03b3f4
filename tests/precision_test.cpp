// Mixed precision and the sharded gradient scaler, against unsharded training with the same
// precision policy (tests/../examples/gpt/step.h) and against fp32.
#include "dist_env.h"
#include "parity_check.h"
#include "test_models.h"

#include "data.h"
#include "step.h"
#include "trainer.h"

#include <fsdp/fused_adamw.h>

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

gpt::TrainOptions small_precision_run() {
  return tiny_gpt_run(/*layers=*/2, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/4);
}

// The unsharded fp16 reference of gpt::train's loop (constant lr, one micro-batch, no clipping)
// with its own loss scaler, gpt::ReferenceLossScaler: none of the library's scaler code runs on
// this side of the comparison.
gpt::TrainResult train_fp16_reference(const gpt::TrainOptions& o, int world) {
  const auto corpus = gpt::ByteCorpus::load(o.data, o.max_data_bytes, o.model.max_seq + 2);
  gpt::GPT model = gpt::make_gpt(o.model, o.seed);
  auto optimizer = gpt::make_optimizer(model, o.lr, o.weight_decay);
  gpt::ReferencePrecision precision(*model, o.fsdp.mixed_precision());
  gpt::ReferenceLossScaler scaler(o.loss_scale);
  gpt::TrainResult result;
  for (int64_t step = 0; step < o.steps; ++step) {
    optimizer->zero_grad();
    auto [inputs, targets] = corpus.batch(o.seed, step, 0, world * o.batch, o.model.max_seq);
    precision.cast_parameters();
    auto loss = gpt::lm_loss(model(inputs), targets);
    scaler.scale(loss).backward();
    precision.restore_masters();
    scaler.unscale_step_update(*optimizer);
    result.losses.push_back(loss.item<double>());
  }
  for (auto& item : model->named_parameters()) {
    result.final_params.emplace_back(item.key(), item.value().detach().clone());
  }
  return result;
}

struct ShardedAndReference {
  gpt::TrainResult sharded, reference;
};

// The run under test and its unsharded reference with the same precision policy (fp16: the
// library's sharded scaler against the reference's own, at a scale at which neither overflows; a
// rank's local gradient is W times the reference's, so at a scale near the limit the runs would
// skip different steps).
ShardedAndReference train_both(gpt::TrainOptions o) {
  ShardedAndReference runs;
  runs.sharded = gpt::train(o, &dist());
  o.reference_world_size = dist().world_size();
  const bool fp16 = o.fsdp.mixed_precision().param_dtype() == at::kHalf;
  runs.reference = fp16 ? train_fp16_reference(o, dist().world_size()) : gpt::train(o, nullptr);
  return runs;
}

void expect_matches_reference_policy(fsdp::MixedPrecision policy, double unit_roundoff) {
  auto o = small_precision_run();
  o.fsdp.mixed_precision(policy);
  o.loss_scale = 1024;
  const LowPrecisionTolerance tol{unit_roundoff, dist().world_size()};

  auto one_step = o;
  one_step.steps = 1;
  const auto first = train_both(one_step);
  const auto runs = train_both(o);
  expect_low_precision_parity(first.sharded, first.reference, runs.sharded, runs.reference, o, tol,
                              "vs reference, same policy");

  // And low-precision training tracks full precision (the masters are fp32): the losses differ
  // by the forward's rounding, a few unit roundoffs of the logits.
  auto fp32 = small_precision_run();
  fp32.reference_world_size = dist().world_size();
  expect_losses_within(runs.sharded.losses, gpt::train(fp32, nullptr).losses, 4 * unit_roundoff,
                       "vs fp32 reference");
}

TEST(MixedPrecision, Bf16TrainingMatchesTheUnshardedBf16Reference) {
  expect_matches_reference_policy(fsdp::MixedPrecision().param_dtype(at::kBFloat16), 1.0 / 256);
}

TEST(MixedPrecision, Bf16ComputeWithFp32ReductionMatchesTheReference) {
  expect_matches_reference_policy(
      fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat), 1.0 / 256);
}

TEST(MixedPrecision, Fp16TrainingWithTheShardedScalerMatchesTheFp16Reference) {
  // gpt::train adds a ShardedGradScaler for fp16 (a plain one for the reference).
  expect_matches_reference_policy(fsdp::MixedPrecision().param_dtype(at::kHalf), 1.0 / 2048);
}

// One forward and backward of the awkward model; returns the bytes each collective moved.
fsdp::CommStats one_step_bytes(fsdp::MixedPrecision policy) {
  auto model = fsdp::fully_shard(make_odd_net(3), *dist().world,
                                 fsdp::FullyShardOptions().mixed_precision(policy));
  const auto before = fsdp::comm_stats();
  auto [x, y] = odd_batch(0, 4);
  torch::mse_loss(model(x).to(torch::kFloat), y).backward();
  const auto after = fsdp::comm_stats();
  return {after.all_gather_bytes - before.all_gather_bytes,
          after.reduce_scatter_bytes - before.reduce_scatter_bytes,
          after.all_reduce_bytes - before.all_reduce_bytes, 0};
}

TEST(MixedPrecision, AllGatherMovesParamDtypeBytesAndReductionsReduceDtypeBytes) {
  if (dist().world_size() == 1) GTEST_SKIP() << "no communication with one rank";
  const auto fp32 = one_step_bytes({});
  const auto bf16 = one_step_bytes(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
  const auto bf16_fp32 = one_step_bytes(
      fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
  std::printf("all-gather bytes fp32 %lld bf16 %lld; reduce-scatter fp32 %lld bf16 %lld\n",
              (long long)fp32.all_gather_bytes, (long long)bf16.all_gather_bytes,
              (long long)fp32.reduce_scatter_bytes, (long long)bf16.reduce_scatter_bytes);
  ASSERT_GT(fp32.all_gather_bytes, 0);
  EXPECT_EQ(bf16.all_gather_bytes * 2, fp32.all_gather_bytes);
  EXPECT_EQ(bf16.reduce_scatter_bytes * 2, fp32.reduce_scatter_bytes);
  EXPECT_EQ(bf16_fp32.all_gather_bytes * 2, fp32.all_gather_bytes);
  EXPECT_EQ(bf16_fp32.reduce_scatter_bytes, fp32.reduce_scatter_bytes);
}

// A unit that records the weight its forward computes with.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() {
    fc = register_module("fc", torch::nn::Linear(5, 6));
    offset = register_buffer("offset", torch::full({6}, 0.25));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    seen_input_dtype = x.scalar_type();
    seen_weight = fc->weight.detach().clone();
    return fc(x) + offset;
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor offset, seen_weight;
  c10::ScalarType seen_input_dtype = at::kFloat;
};
TORCH_MODULE(Probe);

struct ProbeNetImpl : torch::nn::Module {
  ProbeNetImpl() {
    probe = register_module("probe", Probe());
    head = register_module("head", torch::nn::Linear(6, 2));
    probe_unit = probe;
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(probe_unit(x)); }
  Probe probe{nullptr};
  torch::nn::Linear head{nullptr};
  fsdp::Unit<Probe> probe_unit;
};
TORCH_MODULE(ProbeNet);

TEST(MixedPrecision, ForwardComputesInParamDtypeWhileShardsGradsAndOptimizerStayFp32) {
  torch::manual_seed(5);
  ProbeNet net;
  auto policy = fsdp::MixedPrecision().param_dtype(at::kBFloat16).buffer_dtype(at::kBFloat16);
  auto model = fsdp::fully_shard(net, *dist().world, fsdp::FullyShardOptions().mixed_precision(policy));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto out = model(torch::randn({4, 5}));  // fp32 input: cast to bf16 by the unit
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(net->probe->seen_input_dtype, at::kBFloat16);
  EXPECT_EQ(net->probe->offset.scalar_type(), at::kBFloat16);  // buffer_dtype
  // The unsharded weight is exactly the fp32 master rounded to bf16.
  const auto full = as_map(fsdp::gather_full_params(model));
  ASSERT_EQ(net->probe->seen_weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::equal(net->probe->seen_weight, full.at("probe.fc.weight").to(at::kBFloat16)));

  out.to(torch::kFloat).pow(2).mean().backward();
  optimizer.step();
  for (const auto& param : model->parameters()) {
    EXPECT_EQ(param.scalar_type(), at::kFloat);
    EXPECT_EQ(param.dim(), dist().world_size() > 1 ? 1 : param.dim());  // still sharded
    ASSERT_TRUE(param.grad().defined());
    EXPECT_EQ(param.grad().scalar_type(), at::kFloat);
  }
  for (const auto& state : optimizer.state()) {
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*state.second);
    EXPECT_EQ(adam.exp_avg().scalar_type(), at::kFloat);
    EXPECT_EQ(adam.exp_avg_sq().scalar_type(), at::kFloat);
  }
}

// One fp16 step of an FSDP model through `scaler` (`unscale_first`: unscale_() before step(), as
// before clipping); with `poison`, the last rank's shard alone holds an inf, as an fp16 reduction
// can make it. Returns whether the scaler stepped.
template <class Model>
bool scaled_step(Model& model, torch::optim::Optimizer& optimizer, fsdp::ShardedGradScaler& scaler,
                 int64_t step, bool poison, bool unscale_first = false) {
  const int world = dist().world_size(), rank = dist().rank();
  optimizer.zero_grad();
  auto [x, y] = odd_batch(step, 2 * world);
  auto loss = torch::mse_loss(model(x.narrow(0, 2 * rank, 2)).to(torch::kFloat), y.narrow(0, 2 * rank, 2));
  scaler.scale(loss).backward();
  if (poison && rank == world - 1) {
    for (auto& p : model->parameters()) {
      if (p.grad().defined() && p.grad().numel() > 0) {
        p.grad().view({-1})[0] = std::numeric_limits<float>::infinity();
        break;
      }
    }
  }
  if (unscale_first) scaler.unscale_(optimizer);
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  return stepped;
}

auto fp16_odd_net(uint64_t seed) {
  return fsdp::fully_shard(
      make_odd_net(seed), *dist().world,
      fsdp::FullyShardOptions().mixed_precision(fsdp::MixedPrecision().param_dtype(at::kHalf)));
}

std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone());
  return copies;
}

// LibTorch's AdamW (the scaler unscales) and the fused one (it only checks; the kernel divides).
template <class Optimizer>
void expect_an_overflow_on_one_rank_skips_the_step_on_every_rank() {
  auto model = fp16_odd_net(4);
  Optimizer optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  fsdp::ShardedGradScaler scaler(*dist().world, fsdp::GradScalerOptions().init_scale(1024));

  const auto before = snapshot(model->parameters());
  EXPECT_FALSE(scaled_step(model, optimizer, scaler, 0, /*poison=*/true));
  EXPECT_TRUE(scaler.found_inf());
  EXPECT_EQ(scaler.get_scale(), 512);  // backed off on every rank
  const auto after = snapshot(model->parameters());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after[i]));

  EXPECT_TRUE(scaled_step(model, optimizer, scaler, 0, /*poison=*/false));
  EXPECT_EQ(scaler.get_scale(), 512);
  bool changed = false;
  const auto stepped = snapshot(model->parameters());
  for (size_t i = 0; i < before.size(); ++i) changed |= !torch::equal(before[i], stepped[i]);
  EXPECT_TRUE(changed);
}

TEST(GradScaler, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  expect_an_overflow_on_one_rank_skips_the_step_on_every_rank<torch::optim::AdamW>();
}

TEST(GradScaler, AnOverflowOnOneRankSkipsTheFusedStepOnEveryRank) {
  expect_an_overflow_on_one_rank_skips_the_step_on_every_rank<fsdp::optim::AdamW>();
}

// With fsdp::optim::AdamW the scaler does not unscale: the kernel divides each gradient by the
// scale as it reads it. Against unscale_() first (ATen's unscaling kernel, then the same update
// without a scale): a power-of-two scale divides exactly, so the parameters and the gradients left
// behind are bitwise the same, step after step, with a skipped step between.
TEST(GradScaler, TheFusedAdamWDividesByTheScaleInItsKernelBitwise) {
  auto divided_in_kernel = fp16_odd_net(6);
  auto unscaled_first = fp16_odd_net(6);
  fsdp::optim::AdamW kernel_optimizer(divided_in_kernel->parameters(), torch::optim::AdamWOptions(1e-2));
  fsdp::optim::AdamW plain_optimizer(unscaled_first->parameters(), torch::optim::AdamWOptions(1e-2));
  fsdp::ShardedGradScaler kernel_scaler(*dist().world, fsdp::GradScalerOptions().init_scale(1024));
  fsdp::ShardedGradScaler plain_scaler(*dist().world, fsdp::GradScalerOptions().init_scale(1024));
  const auto start = snapshot(divided_in_kernel->parameters());
  for (int64_t step = 0; step < 4; ++step) {
    const bool poison = step == 2;
    EXPECT_EQ(scaled_step(divided_in_kernel, kernel_optimizer, kernel_scaler, step, poison), !poison);
    EXPECT_EQ(scaled_step(unscaled_first, plain_optimizer, plain_scaler, step, poison, /*unscale_first=*/true),
              !poison);
    const auto a = divided_in_kernel->parameters(), b = unscaled_first->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i << " after step " << step;
      if (!poison && a[i].grad().defined()) {
        EXPECT_TRUE(torch::equal(a[i].grad(), b[i].grad())) << "gradient " << i << " after step " << step;
      }
    }
  }
  // The steps were real: the parameters moved.
  bool moved = false;
  const auto end = divided_in_kernel->parameters();
  for (size_t i = 0; i < start.size(); ++i) moved |= !torch::equal(start[i], end[i]);
  EXPECT_TRUE(moved);
}

}  // namespace
}  // namespace fsdp_test
