// Every sharding strategy trains the GPT like unsharded training on the same global batch, and
// moves exactly the bytes that the ring algorithms send, computed from the units' sizes
// (model_sizes.h), through each kind of collective.
#include "dist_env.h"
#include "test_corpus.h"
#include "model_sizes.h"
#include "parity_check.h"

#include "data.h"
#include "gpt2/gpt2.h"
#include "step.h"
#include "trainer.h"

#include <gtest/gtest.h>

namespace fsdp_test {
namespace {

// The largest shard group with at least two replicas (F = 1 when W is prime), 0 if none.
int hybrid_shard_group_size(int world) {
  for (int f = world / 2; f >= 1; --f) {
    if (world % f == 0) return f;
  }
  return 0;
}

std::vector<fsdp::FullyShardOptions> strategies_for(int world) {
  using S = fsdp::ShardingStrategy;
  std::vector<fsdp::FullyShardOptions> all;
  for (S s : {S::FullShard, S::ShardGradOp, S::NoShard}) all.push_back(fsdp::FullyShardOptions().strategy(s));
  if (int f = hybrid_shard_group_size(world)) {
    for (S s : {S::HybridShard, S::HybridShardGradOp}) {
      all.push_back(fsdp::FullyShardOptions().strategy(s).shard_group_size(f));
    }
  }
  return all;
}

gpt::TrainOptions tiny_run() {
  return tiny_gpt_run(/*layers=*/3, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/4);
}

TEST(Strategy, EveryStrategyMatchesTheUnshardedReference) {
  auto o = tiny_run();
  o.reference_world_size = dist().world_size();
  const auto reference = gpt::train(o, nullptr);
  for (const auto& options : strategies_for(dist().world_size())) {
    SCOPED_TRACE(fsdp::to_string(options.strategy()));
    o.fsdp = options;
    const auto sharded = gpt::train(o, &dist());
    expect_same_losses(sharded.losses, reference.losses);
    expect_same_params(sharded.final_params, as_map(reference.final_params), o.lr * o.steps);
  }
}

// Mixed precision under every strategy (NO_SHARD's unshard is a cast without a collective;
// hybrid reduces in bf16 across the replicas too), against the bf16 reference: bf16 tolerances.
TEST(Strategy, EveryStrategyInBf16MatchesTheBf16Reference) {
  auto o = tiny_run();
  o.fsdp.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
  o.reference_world_size = dist().world_size();
  auto one_step = o;
  one_step.steps = 1;
  const auto first_reference = gpt::train(one_step, nullptr);
  const auto reference = gpt::train(o, nullptr);
  const LowPrecisionTolerance tol{1.0 / 256, dist().world_size()};
  for (auto options : strategies_for(dist().world_size())) {
    SCOPED_TRACE(fsdp::to_string(options.strategy()));
    o.fsdp = options.mixed_precision(fsdp::MixedPrecision().param_dtype(at::kBFloat16));
    one_step.fsdp = o.fsdp;
    expect_low_precision_parity(gpt::train(one_step, &dist()), first_reference, gpt::train(o, &dist()),
                                reference, o, tol, fsdp::to_string(options.strategy()));
  }
}

// One backward's gradient, and the global norm, of every strategy × precision policy against the
// unsharded reference on the same global batch: a wrong division factor (the 16-bit pre-division,
// the post-division, a hybrid replica sum), a wrong shard offset or padding, shows here at once,
// where AdamW's invariance to a constant gradient scale hides it from training runs.
struct GradientCase {
  const char* name;
  fsdp::MixedPrecision policy;
  double unit_roundoff;  // of the dtype the gradient is computed and reduced in (the coarser)
  double loss_scale;     // fp16: scale the loss (by a power of two: exact) so nothing underflows;
                         // the sharded side through fsdp::ShardedGradScaler, the reference by hand
};

std::vector<GradientCase> gradient_cases() {
  return {{"fp32", {}, 0x1p-24, 1},
          {"bf16", fsdp::MixedPrecision().param_dtype(at::kBFloat16), 0x1p-8, 1},
          {"bf16 compute, fp32 reduce",
           fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat), 0x1p-8, 1},
          {"fp16", fsdp::MixedPrecision().param_dtype(at::kHalf), 0x1p-11, 1024}};
}

using Grads = std::map<std::string, torch::Tensor>;

// The reference's gradient of the mean loss over global rows [first, first + rows), computed with
// the policy's precision (parameters cast to param_dtype, the gradient rounded to reduce_dtype).
Grads reference_gradient(const gpt::TrainOptions& o, const fsdp::MixedPrecision& policy,
                         double loss_scale, int64_t first, int64_t rows, double weight) {
  auto model = gpt::make_gpt(o.model, o.seed);
  auto [x, y] = test_corpus().batch(o.seed, 0, first, rows, o.model.max_seq);
  gpt::ReferencePrecision precision(*model, policy);
  precision.cast_parameters();
  (gpt::lm_loss(model(x), y) * (loss_scale * weight)).backward();
  precision.restore_masters();
  Grads grads;
  for (auto& item : model->named_parameters()) grads[item.key()] = item.value().grad() / loss_scale;
  return grads;
}

double norm_of(const torch::Tensor& t) { return t.to(torch::kDouble).norm().item<double>(); }

TEST(Strategy, EveryStrategyAndReduceDtypeGivesTheReferenceGradientAndNorm) {
  const int w = dist().world_size();
  auto o = tiny_run();
  // The rank-local parts of the global gradient (fp32, exact up to fp32 rounding): how large the
  // summands of the reduction are, which bounds the rounding error of summing them.
  std::vector<Grads> partials;
  for (int r = 0; r < w; ++r) {
    partials.push_back(reference_gradient(o, {}, 1, r * o.batch, o.batch, 1.0 / w));
  }
  for (const auto& c : gradient_cases()) {
    const Grads reference = reference_gradient(o, c.policy, c.loss_scale, 0, w * o.batch, 1.0);
    double reference_sq = 0;
    for (const auto& [name, g] : reference) reference_sq += std::pow(norm_of(g), 2);
    const double reference_norm = std::sqrt(reference_sq);
    // Per tensor, ||g - g_ref|| <= k·u·(sum_r ||g_r|| + ||g_ref||) with k = W + 4 roundings
    // (parity_check.h). fp32 computes every matmul in fp32 over up to W·B·T terms in another
    // order: u is then the bound of such a sum, W·B·T·2^-24.
    const double u = c.policy.param_dtype() ? c.unit_roundoff : w * o.batch * o.model.max_seq * c.unit_roundoff;
    const double k = gradient_roundings(w);
    std::map<std::string, double> bound;
    double bound_sq = 0;
    for (const auto& [name, g] : reference) {
      double summands = norm_of(g);
      for (const auto& p : partials) summands += norm_of(p.at(name));
      bound[name] = k * u * summands;
      bound_sq += bound[name] * bound[name];
    }
    for (const auto& options : strategies_for(w)) {
      auto opts = options;
      opts.mixed_precision(c.policy);
      SCOPED_TRACE(std::string(c.name) + " " + fsdp::to_string(opts.strategy()));
      auto model = fsdp::fully_shard(gpt::make_gpt(o.model, o.seed), *dist().world, opts);
      auto [x, y] = test_corpus().batch(o.seed, 0, dist().rank() * o.batch, o.batch, o.model.max_seq);
      auto loss = gpt::lm_loss(model(x), y);
      if (c.loss_scale != 1) {  // fp16: the library's scaler scales and unscales this side
        torch::optim::SGD parameters(model->parameters(), torch::optim::SGDOptions(1.0));
        fsdp::ShardedGradScaler scaler(*dist().world, fsdp::GradScalerOptions().init_scale(c.loss_scale));
        scaler.scale(loss).backward();
        scaler.unscale_(parameters);
        EXPECT_FALSE(scaler.found_inf());
      } else {
        loss.backward();
      }
      // The global norm, then clipping to half of it.
      const double max_norm = reference_norm / 2;
      const double norm = fsdp::clip_grad_norm_(model, max_norm);
      const double norm_bound = std::sqrt(bound_sq);
      EXPECT_LE(std::abs(norm - reference_norm), norm_bound) << norm << " vs " << reference_norm;
      {  // the clipped gradient shards become the parameters: gather them whole
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.copy_(p.grad());
      }
      const double clip = max_norm / reference_norm;  // the reference's clipping factor
      double worst_ratio = 0, worst_rel = 0;
      for (const auto& [name, full] : fsdp::gather_full_params(model)) {
        const auto& g = reference.at(name);
        const double err = norm_of(full.to(torch::kFloat) / clip - g);
        // The clipping factor itself is off by the norm's relative error.
        const double tol = bound.at(name) + norm_of(g) * norm_bound / reference_norm;
        EXPECT_LE(err, tol) << name << ": |g - g_ref| = " << err << ", |g_ref| = " << norm_of(g);
        worst_ratio = std::max(worst_ratio, err / tol);
        worst_rel = std::max(worst_rel, err / std::max(norm_of(g), 1e-30));
      }
      std::printf("%s %s: |norm - ref| / ref = %.2g (bound %.2g); per tensor |g - g_ref| at most "
                  "%.2g of its bound, %.2g of |g_ref|\n", c.name, fsdp::to_string(opts.strategy()),
                  std::abs(norm - reference_norm) / reference_norm, norm_bound / reference_norm,
                  worst_ratio, worst_rel);
    }
  }
}

TEST(Strategy, BytesPerCollectiveMatchTheFormulas) {
  const int w = dist().world_size();
  auto [x, y] = test_corpus().batch(5, 0, dist().rank() * 2, 2, 16);
  for (const auto& options : strategies_for(w)) {
    SCOPED_TRACE(fsdp::to_string(options.strategy()));
    auto o = tiny_run();
    auto model = fsdp::fully_shard(gpt::make_gpt(o.model, 1), *dist().world, options);
    const int64_t f = options.shard_group_size_for(w), r = w / f;
    // Expected from the model's parameter counts and the ring algorithms, not from the library's
    // own unit sizes: FULL_SHARD and hybrid re-gather blocks for backward, the root never.
    const bool regather = options.strategy() == fsdp::ShardingStrategy::FullShard ||
                          options.strategy() == fsdp::ShardingStrategy::HybridShard;
    const auto numels = gpt_unit_numels(o.model);
    ASSERT_EQ(model.units().size(), numels.size());
    int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
    for (const auto& [unit, numel] : numels) {
      const int64_t shard = 4 * shard_elements(numel, f);      // fp32 bytes of a rank's shard
      const int64_t gathers = unit.empty() || !regather ? 1 : 2;  // forward (+ backward)
      all_gather += gathers * (f - 1) * shard;     // ring: F-1 steps, a shard each
      reduce_scatter += (f - 1) * shard;           // ring: F-1 steps, a shard each
      if (r > 1) all_reduce += ring_all_reduce_bytes(shard, r);  // the shard across replicas
    }
    const auto before = fsdp::comm_stats();
    gpt::lm_loss(model(x), y).backward();
    const auto after = fsdp::comm_stats();
    EXPECT_EQ(after.all_gather_bytes - before.all_gather_bytes, all_gather);
    EXPECT_EQ(after.reduce_scatter_bytes - before.reduce_scatter_bytes, reduce_scatter);
    EXPECT_EQ(after.all_reduce_bytes - before.all_reduce_bytes, all_reduce);
    std::printf("%s (F=%lld, R=%lld): all-gather %lld, reduce-scatter %lld, all-reduce %lld bytes\n",
                fsdp::to_string(options.strategy()), (long long)f, (long long)r,
                (long long)all_gather, (long long)reduce_scatter, (long long)all_reduce);
  }
}

TEST(Strategy, ShardGradOpKeepsUnitsUnshardedUntilBackward) {
  auto o = tiny_run();
  auto options = fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::ShardGradOp);
  auto model = fsdp::fully_shard(gpt::make_gpt(o.model, 1), *dist().world, options);
  auto x = torch::zeros({1, 16}, torch::kLong);
  auto logits = model(x);
  // Between forward and backward the gathered blocks wait for backward, their parameters parked
  // on the shards ([Note: between a forward and its backward]): what a step would see.
  auto& weight = model->h[0]->attn.get<gpt::CausalSelfAttention>()->c_attn->weight;
  if (dist().world_size() > 1) {
    EXPECT_EQ(weight.dim(), 1);
  }
  const auto before = fsdp::comm_stats();
  logits.sum().backward();
  EXPECT_EQ(fsdp::comm_stats().all_gather_bytes - before.all_gather_bytes, 0)
      << "backward gathered again what SHARD_GRAD_OP kept";
  if (dist().world_size() > 1) {
    EXPECT_EQ(weight.dim(), 1);
  }
}

}  // namespace
}  // namespace fsdp_test
