#include "llama/rotary.h"

#include <ATen/Parallel.h>

namespace gpt {

// [Note: the rotation in one pass]
// transformers' apply_rotary_pos_emb, x·cos + cat(-x₂, x₁)·sin, is five kernels forward (two
// narrows' negation and concatenation, two products, a sum) and as many backward, each a pass over
// q or k: on the host at small widths more than the rotation's arithmetic (~0.85 ms per layer
// forward and backward at bench's llama-small, q and k). In fp32 on the host the rotation is one
// autograd node: per row of d channels, out_i = x_i·c_i + (−x_{i+d/2})·s_i in the first half and
// x_i·c_i + x_{i−d/2}·s_i in the second, the same products and sum as the ops, so the same bits;
// backward is the transposed rotation of the incoming gradient g (dx_i = g_i·c_i + g_{i+d/2}·s_{i+d/2}
// in the first half, g_i·c_i + (−g_{i−d/2}·s_{i−d/2}) in the second), again the ops' bits. It keeps
// only cos and sin, which the attention keeps anyway: no activation of its own. A backward that
// builds a graph (create_graph) uses the ops.

namespace {

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// The transpose of rotate_half: [y₂, −y₁].
at::Tensor rotate_half_transposed(const at::Tensor& y) {
  const int64_t half = y.size(-1) / 2;
  return torch::cat({y.narrow(-1, half, half), -y.narrow(-1, 0, half)}, -1);
}

bool in_one_pass(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto table = [&](const at::Tensor& t) {
    return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2 &&
           t.size(0) == x.size(2) && t.size(1) == x.size(3);
  };
  return x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 && x.size(3) % 2 == 0 && table(cos) &&
         table(sin);
}

// out <- the rotation of x (or, `transposed`, its transpose), row by row; x and out [B, H, T, d]
// with d contiguous, any strides otherwise.
void rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
                 bool transposed) {
  const int64_t H = x.size(1), T = x.size(2), d = x.size(3), half = d / 2;
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  const int64_t os0 = out.stride(0), os1 = out.stride(1), os2 = out.stride(2);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  at::parallel_for(0, x.size(0) * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = xp + b * xs0 + h * xs1 + t * xs2;
        float* o = op + b * os0 + h * os1 + t * os2;
        const float* c = cp + t * d;
        const float* s = sp + t * d;
        if (!transposed) {
          for (int64_t i = 0; i < half; ++i) o[i] = xr[i] * c[i] + (-xr[i + half]) * s[i];
          for (int64_t i = half; i < d; ++i) o[i] = xr[i] * c[i] + xr[i - half] * s[i];
        } else {
          for (int64_t i = 0; i < half; ++i) o[i] = xr[i] * c[i] + xr[i + half] * s[i + half];
          for (int64_t i = half; i < d; ++i) o[i] = xr[i] * c[i] + (-(xr[i - half] * s[i - half]));
        }
      }
    }
  });
}

at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool transposed) {
  const at::Tensor input = x.stride(-1) == 1 ? x : x.contiguous();
  at::Tensor out = at::empty_like(input);  // the input's layout (q and k are views of [B, T, H, d])
  rotate_rows(input, cos, sin, out, transposed);
  return out;
}

struct RotaryFunction : public torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotated(x, cos, sin, /*transposed=*/false);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &cos = saved[0], &sin = saved[1], &g = grads[0];
    const at::Tensor dx = torch::GradMode::is_enabled() || !in_one_pass(g, cos, sin)
                              ? g * cos + rotate_half_transposed(g * sin)
                              : rotated(g, cos, sin, /*transposed=*/true);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (in_one_pass(x, cos, sin) && !cos.requires_grad() && !sin.requires_grad()) {
    return RotaryFunction::apply(x, cos, sin);
  }
  return x * cos + rotate_half(x) * sin;
}

}  // namespace gpt
