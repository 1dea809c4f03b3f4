#pragma once
// Comparing two runs' parameters and losses in fp32 (a sharded run against the unsharded
// reference), for any model: the tolerances and why. parity_check.h adds the GPT's runs and the
// low-precision tolerances.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp_test {

// Tolerances for fp32. The sharded run sums W per-rank gradients (ring order) where the reference
// reduces one batch of W·B rows inside one kernel, and matmuls over B rows block differently from
// matmuls over W·B rows: each step differs by float reassociation, ~1e-7 relative (the losses).
// AdamW divides each gradient element by its own RMS, so an element whose exact gradient is zero
// but whose computed one is rounding noise (GPT's key bias: softmax ignores a per-row constant)
// moves by noise/noise, up to ~lr per step, differently in each run. Such elements are few
// (measured 0.02-0.6% of a GPT after 8 steps; which ones depends on the build's memory layout,
// as blocked kernels round differently on differently aligned buffers); every other parameter
// element must agree to 1e-6. A real error (a missed reduction, a wrong scale) moves nearly all.
constexpr double kLossRelTol = 2e-5;
constexpr double kParamAbsTol = 1e-6;
constexpr double kNoiseElementsMaxFraction = 0.02;

inline std::map<std::string, torch::Tensor> as_map(
    const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  return {params.begin(), params.end()};
}

// All parameters agree to kParamAbsTol except at most a small fraction, which stay within
// `outlier_tol` (the optimizer's bound on how far noise can push them).
inline void expect_same_params(const std::vector<std::pair<std::string, torch::Tensor>>& sharded,
                        const std::map<std::string, torch::Tensor>& reference,
                        double outlier_tol = kParamAbsTol) {
  ASSERT_EQ(sharded.size(), reference.size());
  double worst = 0;
  int64_t outliers = 0, total = 0;
  for (const auto& [name, tensor] : sharded) {
    ASSERT_TRUE(reference.count(name)) << "unexpected parameter " << name;
    const auto& expected = reference.at(name);
    ASSERT_EQ(tensor.sizes(), expected.sizes()) << name;
    const auto diff = (tensor - expected).abs();
    worst = std::max(worst, diff.max().item<double>());
    outliers += (diff > kParamAbsTol).sum().item<int64_t>();
    total += tensor.numel();
    EXPECT_LE(diff.max().item<double>(), outlier_tol) << name;
  }
  std::printf("max |param - reference| = %.3g; %lld of %lld elements differ by more than %.0e\n",
              worst, (long long)outliers, (long long)total, kParamAbsTol);
  EXPECT_LE(outliers, kNoiseElementsMaxFraction * total);
}

/// Losses of two runs agree step by step within kLossRelTol.
inline void expect_same_losses(const std::vector<double>& sharded, const std::vector<double>& reference) {
  ASSERT_EQ(sharded.size(), reference.size());
  double worst = 0;
  for (size_t i = 0; i < sharded.size(); ++i) {
    const double rel = std::abs(sharded[i] - reference[i]) / reference[i];
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kLossRelTol) << "step " << i << ": " << sharded[i] << " vs " << reference[i];
  }
  std::printf("max relative loss difference = %.3g\n", worst);
}

}  // namespace fsdp_test
