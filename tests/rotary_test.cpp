// The Llama's rotary rotation (examples/gpt/rotary.cpp, [Note: the rotation in one pass]) against
// transformers' ops written here: the same bits forward and backward, on q's strided layout.
#include "llama/rotary.h"

#include <gtest/gtest.h>

namespace {

// transformers' apply_rotary_pos_emb: x·cos + rotate_half(x)·sin.
torch::Tensor rotation_by_the_ops(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  return x * cos + torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1) * sin;
}

// [B, H, T, d] as the attention makes it: a transposed view of [B, T, H, d].
torch::Tensor heads_first(torch::ScalarType dtype) {
  return torch::randn({2, 7, 3, 16}).to(dtype).transpose(1, 2).requires_grad_();
}

// `x` and the incoming gradient strided as the attention's are, and (`first_positions`) a view of
// the first positions only, whose rows are not packed.
void expect_the_ops_bits(int64_t first_positions) {
  const torch::Tensor cos = torch::randn({first_positions, 16}), sin = torch::randn({first_positions, 16});
  const torch::Tensor x = heads_first(torch::kFloat);
  const torch::Tensor x_ops = x.detach().clone().requires_grad_();
  const torch::Tensor g = torch::randn({2, 7, 3, 16}).transpose(1, 2).narrow(2, 0, first_positions);
  const torch::Tensor got = gpt::apply_rope(x.narrow(2, 0, first_positions), cos, sin);
  const torch::Tensor want = rotation_by_the_ops(x_ops.narrow(2, 0, first_positions), cos, sin);
  EXPECT_TRUE(torch::equal(got, want)) << first_positions;
  got.backward(g);
  want.backward(g);
  EXPECT_TRUE(torch::equal(x.grad(), x_ops.grad())) << first_positions;
}

TEST(Rotary, GivesTheOpsBitsForwardAndBackward) {
  torch::manual_seed(11);
  expect_the_ops_bits(7);
  expect_the_ops_bits(4);
}

// create_graph: the gradient of a loss through the rotation is differentiable again.
TEST(Rotary, HasASecondDerivative) {
  torch::manual_seed(12);
  const torch::Tensor cos = torch::randn({7, 16}), sin = torch::randn({7, 16});
  auto second = [&](const torch::Tensor& x, auto rotation) {
    const torch::Tensor y = rotation(x, cos, sin);
    const torch::Tensor dx = torch::autograd::grad({(y * y * y).sum()}, {x}, {}, true, true)[0];
    return torch::autograd::grad({(dx * dx).sum()}, {x})[0];
  };
  const torch::Tensor x = heads_first(torch::kFloat);
  const torch::Tensor want = second(x.detach().clone().requires_grad_(), rotation_by_the_ops);
  const torch::Tensor got = second(x, gpt::apply_rope);
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max();
}

// In bf16 with bf16 tables (mixed precision) and with fp32 ones (promoted to fp32 by the ops).
TEST(Rotary, RoundsAsTheOpsBelowFp32) {
  torch::manual_seed(13);
  const torch::Tensor x = heads_first(torch::kBFloat16);
  for (auto table_dtype : {torch::kBFloat16, torch::kFloat}) {
    const torch::Tensor cos = torch::randn({7, 16}).to(table_dtype), sin = torch::randn({7, 16}).to(table_dtype);
    EXPECT_TRUE(torch::equal(gpt::apply_rope(x, cos, sin), rotation_by_the_ops(x, cos, sin)));
  }
}

}  // namespace
