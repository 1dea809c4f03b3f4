#pragma once
// Comparing a sharded run with the unsharded reference: the tolerances and why.

#include "dist_env.h"
#include "param_compare.h"
#include "test_corpus.h"
#include "step.h"
#include "trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp_test {

/// A small GPT run on this project's sources (lr 3e-3, at most 1 MiB of text).
inline gpt::TrainOptions tiny_gpt_run(int64_t layers, int64_t dim, int64_t heads, int64_t seq,
                                      int64_t batch, int64_t steps) {
  gpt::TrainOptions o;
  o.model.layers = layers;
  o.model.dim = dim;
  o.model.heads = heads;
  o.model.max_seq = seq;
  o.batch = batch;
  o.steps = steps;
  o.lr = 3e-3;
  o.data = corpus_dir();
  o.max_data_bytes = 1 << 20;
  return o;
}

// Low-precision tolerances. The sharded run and the reference compute the same forward (each row
// of a matmul is the same dot products, rounded once to the compute dtype), but the weight
// gradient of a rank sums B rows where the reference sums W·B, and each sum is rounded to the
// compute dtype; the reduction adds W such parts. Counting roundings, each element of the sharded
// gradient is rounded once when a rank computes its part, W-1 times by the ring's additions, once
// by a post-division that is not a power of two; the reference's once; a forward or backward
// whose kernels block W·B rows differently from B may round an intermediate differently (twice
// more): at most kGradientRoundings(W) = W + 4 unit roundoffs u of the summands (bf16
// u = 2^-8 = 3.9e-3, fp16 u = 2^-11 = 4.9e-4). Strategy.EveryStrategyAndReduceDtype... checks
// exactly that on one step's gradients.
//
// AdamW turns a gradient perturbed by a relative δ into an update perturbed by at most about 2δ·lr
// (its update m̂/√v̂ is a ratio of moments of the same gradients: Cauchy-Schwarz over the moments'
// weights bounds the change of either by δ), so after one step from the same weights an element
// whose gradient is not rounding noise differs by at most 2·lr·(W+4)·u; first_step_element_diff
// allows twice that. An element whose gradient is all rounding noise (first_step_noise below) moves by up to
// 2·lr differently. A wrong reduction (a missed sum, a wrong offset) perturbs nearly every
// gradient by O(1) and moves nearly every element by ~lr.
//
// Over n steps the same argument needs the weights to differ by rounding only, and they do not:
// once a noise element that every row uses (a bias) has moved by ±lr differently, the next
// gradients differ by far more than (W+4)·u. After 4 steps 10.5% of the elements were beyond
// 4·n·lr·(W+4)·u (fp16, W = 3, one seed of 14 measured; 0.2-1.2% with the others). So the
// low-precision training tests check element by element after one step only, and after n steps
// the losses (within u: about u times their sensitivity) and the mean parameter difference (below
// 2·n·lr·(u + kNoiseElementsMaxFraction)).
inline double gradient_roundings(int world) { return world + 4; }

struct LowPrecisionTolerance {
  double unit_roundoff;
  int world;
  double loss_rel() const { return unit_roundoff; }
  double mean_param_diff(const gpt::TrainOptions& o) const {
    return 2 * o.steps * o.lr * (unit_roundoff + kNoiseElementsMaxFraction);
  }
  double first_step_element_diff(double lr) const {
    return 4 * lr * gradient_roundings(world) * unit_roundoff;
  }
};

// Which elements of the first step's gradient are rounding noise: their sign may come out either
// way, and AdamW's first step moves each by ±lr whatever its size. The rounding model above
// bounds a gradient's error by gradient_roundings(W)·u relative to what is summed, which is the
// gradient's own size only when the summands do not cancel. Two kinds of cancellation, each
// found on the same weights and rows by plain LibTorch autograd (none of the code under test):
//  - across ranks: the W parts (B rows each) nearly cancel, |Σ part| < r·Σ|part| (double precision);
//  - inside the batch (GPT's key bias: softmax ignores a per-row constant, so its exact gradient
//    is 0): the reference's own low-precision gradient (ReferencePrecision, loss-scaled as the
//    runs are) is off the double-precision one by more than r·|gradient|. This also counts
//    elements that the forward's rounding (which both runs share) moves that far: a few percent.
// r = kNoiseMargin·gradient_roundings(W)·u; the margin because a part is itself a sum of rows.
constexpr double kNoiseMargin = 4;
constexpr double kFirstStepNoiseMaxFraction = 0.2;

// The unsharded reference's gradient of the first step: ReferencePrecision's (computed in
// param_dtype, rounded to reduce_dtype, added to the fp32 masters'), in double.
inline std::map<std::string, torch::Tensor> reference_low_precision_gradient(
    const gpt::TrainOptions& o, const torch::Tensor& inputs, const torch::Tensor& targets) {
  gpt::GPT model = gpt::make_gpt(o.model, o.seed);
  gpt::ReferencePrecision precision(*model, o.fsdp.mixed_precision());
  precision.cast_parameters();
  (gpt::lm_loss(model(inputs), targets) * o.loss_scale).backward();
  precision.restore_masters();
  std::map<std::string, torch::Tensor> gradient;
  for (auto& item : model->named_parameters()) {
    gradient[item.key()] = item.value().grad().to(torch::kDouble) / o.loss_scale;
  }
  return gradient;
}

inline std::map<std::string, torch::Tensor> first_step_noise(const gpt::TrainOptions& o, int world,
                                                            double unit_roundoff) {
  auto [inputs, targets] = test_corpus().batch(o.seed, 0, 0, world * o.batch, o.model.max_seq);
  const auto exact_loss = [](const torch::Tensor& logits, const torch::Tensor& y) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  };
  std::map<std::string, torch::Tensor> gradient, abs_parts;
  for (int rank = 0; rank < world; ++rank) {
    gpt::GPT model = gpt::make_gpt(o.model, o.seed);
    model->to(torch::kDouble);
    const auto rows = [&](const torch::Tensor& t) { return t.narrow(0, rank * o.batch, o.batch); };
    (exact_loss(model(rows(inputs)), rows(targets)) / world).backward();
    for (auto& item : model->named_parameters()) {
      const auto part = item.value().grad();
      auto& sum = gradient[item.key()];
      auto& abs_sum = abs_parts[item.key()];
      sum = sum.defined() ? sum + part : part.clone();
      abs_sum = abs_sum.defined() ? abs_sum + part.abs() : part.abs();
    }
  }
  const auto low_precision = reference_low_precision_gradient(o, inputs, targets);
  const double r = kNoiseMargin * gradient_roundings(world) * unit_roundoff;
  std::map<std::string, torch::Tensor> noise;
  for (const auto& [name, g] : gradient) {
    noise[name] = (g.abs() < r * abs_parts.at(name)) | ((low_precision.at(name) - g).abs() > r * g.abs());
  }
  return noise;
}

// After one step from the same weights: every element outside `noise` within element_diff (the
// rounding model holds there), the noise elements within AdamW's 2·lr.
inline void expect_first_step_within(const std::vector<std::pair<std::string, torch::Tensor>>& sharded,
                                     const std::map<std::string, torch::Tensor>& reference,
                                     const std::map<std::string, torch::Tensor>& noise,
                                     double element_diff, double lr) {
  int64_t total = 0, noisy = 0, beyond_noise = 0, beyond_model = 0;
  for (const auto& [name, tensor] : sharded) {
    const auto diff = (tensor - reference.at(name)).abs();
    const auto is_noise = noise.at(name);
    const auto beyond = diff > element_diff;
    total += tensor.numel();
    noisy += is_noise.sum().item<int64_t>();
    beyond_noise += (beyond & is_noise).sum().item<int64_t>();
    beyond_model += (beyond & ~is_noise).sum().item<int64_t>();
    EXPECT_EQ((beyond & ~is_noise).sum().item<int64_t>(), 0)
        << name << ": elements whose gradient is not rounding noise differ by more than " << element_diff
        << " (max " << diff.masked_select(~is_noise).max().item<double>() << ")";
    EXPECT_LE(diff.max().item<double>(), 2 * lr * (1 + 1e-3)) << name;
  }
  std::printf("first step: %lld of %lld gradient elements are rounding noise, %lld of them moved by "
              "more than %.3g; %lld other elements did\n", (long long)noisy, (long long)total,
              (long long)beyond_noise, element_diff, (long long)beyond_model);
  // The classification must leave the check its teeth: a wrong reduction moves nearly every element.
  EXPECT_LE(noisy, kFirstStepNoiseMaxFraction * total);
}

inline double mean_abs_diff(const std::vector<std::pair<std::string, torch::Tensor>>& sharded,
                            const std::map<std::string, torch::Tensor>& reference) {
  double sum = 0;
  int64_t total = 0;
  for (const auto& [name, tensor] : sharded) {
    sum += (tensor - reference.at(name)).abs().sum().item<double>();
    total += tensor.numel();
  }
  return sum / total;
}

inline void expect_mean_param_diff_within(const std::vector<std::pair<std::string, torch::Tensor>>& sharded,
                                          const std::map<std::string, torch::Tensor>& reference,
                                          double mean_diff) {
  const double mean = mean_abs_diff(sharded, reference);
  std::printf("parameters: mean |diff| %.3g (bound %.3g)\n", mean, mean_diff);
  EXPECT_LE(mean, mean_diff);
}

inline void expect_losses_within(const std::vector<double>& a, const std::vector<double>& b, double rel,
                          const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / b[i]);
  std::printf("%s: max relative loss difference %.3g (tolerance %.3g)\n", what, worst, rel);
  EXPECT_LE(worst, rel) << what;
}

// A low-precision run against its reference with the same policy: element by element after one
// step from the same weights (`first_*`, trained with steps = 1), where the rounding model holds;
// after o.steps (`sharded`, `reference`) the losses, and the parameters on average. Not element by
// element there: once a noise element has moved by ±lr differently (a bias that every row adds,
// say), the runs' weights differ by more than rounding and so does every later gradient.
inline void expect_low_precision_parity(const gpt::TrainResult& first_sharded,
                                        const gpt::TrainResult& first_reference,
                                        const gpt::TrainResult& sharded,
                                        const gpt::TrainResult& reference,
                                        const gpt::TrainOptions& o, const LowPrecisionTolerance& tol,
                                        const std::string& what) {
  auto one_step = o;
  one_step.steps = 1;
  expect_first_step_within(first_sharded.final_params, as_map(first_reference.final_params),
                           first_step_noise(one_step, tol.world, tol.unit_roundoff),
                           tol.first_step_element_diff(o.lr), o.lr);
  expect_losses_within(sharded.losses, reference.losses, tol.loss_rel(), what.c_str());
  expect_mean_param_diff_within(sharded.final_params, as_map(reference.final_params),
                                tol.mean_param_diff(o));
}

}  // namespace fsdp_test
