#include "llama/rms_norm.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace gpt {

// [Note: RMSNorm in one pass]
// transformers' LlamaRMSNorm, op by op, is six kernels forward (pow, mean, add, rsqrt, two
// products) and about ten backward, each a pass over the activations, and it keeps the normalised
// x for the weight's gradient. On the host at small widths those passes cost more than the norm's
// arithmetic: 0.66 ms per norm forward and backward at 1024 tokens of 128 (bench's llama-small,
// 9 norms a step, ~7% of the step), where LayerNorm (GPT-2) is one ATen kernel each way. In fp32 a
// norm is therefore one autograd node: forward computes each row's inverse RMS
// r = 1 / sqrt(Σx²/C + eps) and y = w·(x·r) in one pass and keeps x and r (4 bytes a row) for
// backward; backward computes, per row, dx = r·(g − x̂·mean(g·x̂)) with g = dy·w and x̂ = x·r (the
// exact gradient: d r / d x_i = −r³·x_i / C), and dw = Σ_rows dy·x̂ summed in double. The values
// are the formula's up to the order of the sums (fp32 rounding), which the parity tests against
// transformers allow. Below fp32 the norm stays op by op: transformers rounds the normalised x to
// the low dtype before the weight multiplies it, and the parity tests compare those roundings.
// A backward that builds a graph (create_graph) computes the same gradient with ATen's
// differentiable ops, r recomputed from x, so that a second derivative exists.

namespace {

constexpr int64_t kRowsPerTask = 64;

// Σ a_i·b_i in 8 lanes (the compiler vectorises independent lanes, not one running sum).
float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += a[i + j] * b[i + j];
  }
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void forward_rows(const float* x, const float* w, float* y, float* inv_rms, int64_t rows, int64_t width,
                  float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * width;
      float* yr = y + r * width;
      const float mean_square = dot(xr, xr, width) / static_cast<float>(width);
      const float rs = 1.0f / std::sqrt(mean_square + eps);
      inv_rms[r] = rs;
      for (int64_t i = 0; i < width; ++i) yr[i] = w[i] * (xr[i] * rs);
    }
  });
}

void input_grad_rows(const float* dy, const float* x, const float* w, const float* inv_rms, float* dx,
                     int64_t rows, int64_t width) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    std::vector<float> g(static_cast<size_t>(width));
    for (int64_t r = begin; r < end; ++r) {
      const float* dyr = dy + r * width;
      const float* xr = x + r * width;
      float* dxr = dx + r * width;
      const float rs = inv_rms[r];
      for (int64_t i = 0; i < width; ++i) g[i] = dyr[i] * w[i];
      const float mean_g_xhat = rs * dot(g.data(), xr, width) / static_cast<float>(width);
      for (int64_t i = 0; i < width; ++i) dxr[i] = rs * (g[i] - (xr[i] * rs) * mean_g_xhat);
    }
  });
}

// Σ over rows of dy·x̂, one column per weight, accumulated in double (rows can be many).
void weight_grad(const float* dy, const float* x, const float* inv_rms, float* dw, int64_t rows, int64_t width) {
  std::vector<double> sums(static_cast<size_t>(width), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * width;
    const float* xr = x + r * width;
    const float rs = inv_rms[r];
    for (int64_t i = 0; i < width; ++i) sums[i] += static_cast<double>(dyr[i] * (xr[i] * rs));
  }
  for (int64_t i = 0; i < width; ++i) dw[i] = static_cast<float>(sums[i]);
}

bool on_host_kernels(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.is_cpu() && weight.is_cpu() && weight.is_contiguous() && x.is_contiguous();
}

torch::Tensor inverse_rms(const torch::Tensor& x, double eps) {
  return torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

struct RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    const torch::Tensor input = x.contiguous();
    const int64_t width = input.size(-1), rows = width == 0 ? 0 : input.numel() / width;
    torch::Tensor y, inv_rms;
    if (on_host_kernels(input, weight)) {
      y = torch::empty_like(input);
      auto row_shape = input.sizes().vec();
      row_shape.back() = 1;
      inv_rms = torch::empty(row_shape, input.options());
      forward_rows(input.const_data_ptr<float>(), weight.const_data_ptr<float>(), y.mutable_data_ptr<float>(),
                   inv_rms.mutable_data_ptr<float>(), rows, width, static_cast<float>(eps));
    } else {
      inv_rms = inverse_rms(input, eps);
      y = weight * (input * inv_rms);
    }
    ctx->save_for_backward({input, weight, inv_rms});
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const torch::Tensor dy = grads[0].contiguous();
    torch::Tensor dx, dw;
    if (!torch::GradMode::is_enabled() && on_host_kernels(x, weight)) {
      const int64_t width = x.size(-1), rows = width == 0 ? 0 : x.numel() / width;
      const float* inv_rms = saved[2].const_data_ptr<float>();
      if (ctx->needs_input_grad(0)) {
        dx = torch::empty_like(x);
        input_grad_rows(dy.const_data_ptr<float>(), x.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                        inv_rms, dx.mutable_data_ptr<float>(), rows, width);
      }
      if (ctx->needs_input_grad(1)) {
        dw = torch::empty_like(weight);
        weight_grad(dy.const_data_ptr<float>(), x.const_data_ptr<float>(), inv_rms, dw.mutable_data_ptr<float>(),
                    rows, width);
      }
    } else {
      // Under create_graph r is recomputed from x, so that the gradient is differentiable in x.
      const torch::Tensor inv_rms =
          torch::GradMode::is_enabled() ? inverse_rms(x, ctx->saved_data["eps"].toDouble()) : saved[2];
      const torch::Tensor x_hat = x * inv_rms;
      const torch::Tensor g = dy * weight;
      dx = inv_rms * (g - x_hat * (g * x_hat).mean(-1, /*keepdim=*/true));
      dw = (dy * x_hat).reshape({-1, x.size(-1)}).sum(0);
    }
    return {dx, dw, torch::Tensor()};
  }
};

// transformers' formula op by op, in any dtype.
torch::Tensor rms_norm_op_by_op(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat);
  return weight * (x32 * inverse_rms(x32, eps)).to(x.scalar_type());
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat) {
    return RMSNormFunction::apply(x, weight, eps);
  }
  return rms_norm_op_by_op(x, weight, eps);
}

}  // namespace gpt
