// The Llama's RMSNorm (examples/gpt/rms_norm.cpp, [Note: RMSNorm in one pass]) against the
// formula computed here in double: its values, both gradients, a second derivative, and the
// rounding transformers does below fp32.
#include "llama/rms_norm.h"

#include <gtest/gtest.h>

namespace {

constexpr double kEps = 1e-5;

// weight · x / sqrt(mean(x²) + eps) in double, with autograd's own gradients.
torch::Tensor formula(const torch::Tensor& x, const torch::Tensor& weight) {
  return weight * x / torch::sqrt((x * x).sum(-1, /*keepdim=*/true) / x.size(-1) + kEps);
}

// Rows of very different sizes: at 1e-3 eps outweighs mean(x²), at 30 it does not matter.
torch::Tensor rows_of_mixed_scale(int64_t width) {
  const torch::Tensor scale = torch::tensor({1.0, 1e-3, 30.0, 0.2, 1.0}, torch::kDouble).reshape({1, 5, 1});
  return torch::randn({3, 5, width}, torch::kDouble) * scale;
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kDouble) - want).abs().max() / want.abs().max()).item<double>();
}

TEST(RMSNorm, MatchesTheFormulaInDoubleWithBothGradients) {
  torch::manual_seed(7);
  for (int64_t width : {40, 128, 131}) {  // 131: a tail past the 8-lane loop
    const torch::Tensor x64 = rows_of_mixed_scale(width).requires_grad_();
    const torch::Tensor w64 = (1 + 0.5 * torch::randn({width}, torch::kDouble)).requires_grad_();
    const torch::Tensor dy64 = torch::randn({3, 5, width}, torch::kDouble);
    const torch::Tensor want = formula(x64, w64);
    want.backward(dy64);

    const torch::Tensor x = x64.detach().to(torch::kFloat).requires_grad_();
    const torch::Tensor w = w64.detach().to(torch::kFloat).requires_grad_();
    const torch::Tensor got = gpt::rms_norm(x, w, kEps);
    got.backward(dy64.to(torch::kFloat));
    // Per row too: the tiny rows' values are far below the large rows', and must be right as well.
    for (int64_t row = 0; row < 5; ++row) {
      EXPECT_LT(relative_error(got.select(1, row), want.detach().select(1, row)), 2e-6) << width << " row " << row;
      EXPECT_LT(relative_error(x.grad().select(1, row), x64.grad().select(1, row)), 2e-5) << width << " row " << row;
    }
    EXPECT_LT(relative_error(w.grad(), w64.grad()), 2e-6) << width;
  }
}

TEST(RMSNorm, TakesAStridedInputAndAFrozenWeight) {
  torch::manual_seed(8);
  const torch::Tensor x64 = torch::randn({64, 6}, torch::kDouble).requires_grad_();
  const torch::Tensor w64 = torch::randn({64}, torch::kDouble);
  const torch::Tensor want = formula(x64.t(), w64);
  want.sum().backward();
  const torch::Tensor x = x64.detach().to(torch::kFloat).requires_grad_();
  const torch::Tensor got = gpt::rms_norm(x.t(), w64.to(torch::kFloat), kEps);  // [6, 64], strided
  got.sum().backward();
  EXPECT_LT(relative_error(got, want.detach()), 2e-6);
  EXPECT_LT(relative_error(x.grad(), x64.grad()), 2e-5);
}

// create_graph: the gradient is itself differentiable (a gradient penalty, a Hessian-vector product).
TEST(RMSNorm, HasASecondDerivative) {
  torch::manual_seed(9);
  const torch::Tensor x64 = torch::randn({4, 32}, torch::kDouble).requires_grad_();
  const torch::Tensor w64 = torch::randn({32}, torch::kDouble).requires_grad_();
  const torch::Tensor dy = torch::randn({4, 32}, torch::kDouble);
  const torch::Tensor v = torch::randn({4, 32}, torch::kDouble);
  auto second = [&](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& y) {
    const torch::Tensor dx = torch::autograd::grad({y}, {x}, {dy.to(y.scalar_type())}, true, true)[0];
    return torch::autograd::grad({(dx * v.to(dx.scalar_type())).sum()}, {x, w});
  };
  const auto want = second(x64, w64, formula(x64, w64));
  const torch::Tensor x = x64.detach().to(torch::kFloat).requires_grad_();
  const torch::Tensor w = w64.detach().to(torch::kFloat).requires_grad_();
  const auto got = second(x, w, gpt::rms_norm(x, w, kEps));
  EXPECT_LT(relative_error(got[0], want[0]), 1e-4);
  EXPECT_LT(relative_error(got[1], want[1]), 1e-4);
}

// Below fp32 transformers rounds the normalised x to the input's dtype before the weight
// multiplies it: the same roundings, bitwise.
TEST(RMSNorm, RoundsAsTransformersDoesBelowFp32) {
  torch::manual_seed(10);
  const torch::Tensor x = torch::randn({4, 48}).to(torch::kBFloat16);
  const torch::Tensor w = (1 + torch::randn({48})).to(torch::kBFloat16);
  const torch::Tensor x32 = x.to(torch::kFloat);
  const torch::Tensor normalised = x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + kEps);
  const torch::Tensor want = w * normalised.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(gpt::rms_norm(x, w, kEps), want));
}

}  // namespace
