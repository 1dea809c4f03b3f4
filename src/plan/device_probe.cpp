#include <fsdp/plan.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>

namespace fsdp {

namespace {

using Clock = std::chrono::steady_clock;

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) at::zeros({1}, at::TensorOptions().device(device)).cpu();
}

// Seconds per call of `work`, after a warm-up call, over at least `budget_s` (and 3 calls).
template <typename Work>
double seconds_per_call(const c10::Device& device, double budget_s, Work work) {
  work();
  synchronize(device);
  int calls = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    work();
    ++calls;
    synchronize(device);
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < budget_s || calls < 3);
  return elapsed / calls;
}

// Forward and backward of `f` on leaves `inputs`, as a model runs them.
template <typename F>
double forward_backward_seconds(const c10::Device& device, std::vector<at::Tensor> inputs, F f) {
  for (auto& t : inputs) t.requires_grad_(true);
  return seconds_per_call(device, 0.3, [&] {
    at::Tensor out = f(inputs);
    torch::autograd::backward({out}, {at::ones_like(out)});
    for (auto& t : inputs) t.mutable_grad() = at::Tensor();
  });
}

KernelRates rates(const c10::Device& device, c10::ScalarType dtype, const ProbeShape& s) {
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  KernelRates r;
  {  // a Linear [tokens, width] -> [tokens, 4·width]: three products of 2·m·k·n each
    const int64_t m = s.tokens, k = s.width, n = 4 * s.width;
    const double t = forward_backward_seconds(device, {at::randn({m, k}, options), at::randn({n, k}, options)},
                                              [](const std::vector<at::Tensor>& v) { return at::linear(v[0], v[1]); });
    r.matmul_flops = 3 * 2.0 * m * k * n / t;
  }
  {  // causal attention: QKᵀ and PV over half the scores, forward; twice that backward
    const int64_t b = s.sequences, h = s.heads, t_len = s.sequence, d = std::max<int64_t>(1, s.width / s.heads);
    auto q = at::randn({b, h, t_len, d}, options), k = at::randn({b, h, t_len, d}, options),
         v = at::randn({b, h, t_len, d}, options);
    const double t = forward_backward_seconds(device, {q, k, v}, [](const std::vector<at::Tensor>& x) {
      return at::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, /*is_causal=*/true);
    });
    r.attention_flops = 3 * 2.0 * b * t_len * t_len * h * d / t;
  }
  {  // tanh-GELU on an MLP's hidden activations
    const int64_t n = s.tokens * 4 * s.width;
    const double t = forward_backward_seconds(device, {at::randn({n}, options)},
                                              [](const std::vector<at::Tensor>& x) { return at::gelu(x[0], "tanh"); });
    r.transcendentals = static_cast<double>(n) / t;
  }
  {  // an add of two activations: reads two, writes one
    const int64_t n = s.tokens * s.width;
    const at::Tensor x = at::randn({n}, options), y = at::randn({n}, options);
    at::Tensor z = at::empty({n}, options);
    const double t = seconds_per_call(device, 0.2, [&] { at::add_out(z, x, y); });
    r.memory_bandwidth = 3.0 * n * static_cast<double>(c10::elementSize(dtype)) / t;
  }
  return r;
}

}  // namespace

PlanDevice probe_device(const c10::Device& device, const ProbeShape& shape) {
  PlanDevice d;
  d.name = device.str();
  d.fp32 = rates(device, at::kFloat, shape);
  d.low_precision = rates(device, at::kBFloat16, shape);
  // What an op costs beyond its arithmetic (dispatch, autograd's node, allocations): a tiny
  // Linear's forward and backward, as a third per kernel (a model's time counts 3 per forward op).
  const auto options = at::TensorOptions().device(device).dtype(at::kFloat);
  const double tiny = forward_backward_seconds(device, {at::randn({2, 8}, options), at::randn({8, 8}, options)},
                                               [](const std::vector<at::Tensor>& v) { return at::linear(v[0], v[1]); });
  d.op_overhead_s = tiny / 3;
  if (device.is_cuda()) {  // what an offloaded run moves: host memory, and pinned copies up
    const auto host = at::TensorOptions().dtype(at::kFloat);
    const int64_t n = 16 << 20;
    const at::Tensor x = at::randn({n}, host), y = at::randn({n}, host);
    at::Tensor z = at::empty({n}, host);
    d.host_memory_bandwidth = 3.0 * 4 * n / seconds_per_call(c10::Device(c10::kCPU), 0.2, [&] { at::add_out(z, x, y); });
    const at::Tensor pinned = at::empty({n}, host.pinned_memory(true));
    at::Tensor on_device = at::empty({n}, options);
    d.host_link_bandwidth = 4.0 * n / seconds_per_call(device, 0.2, [&] { on_device.copy_(pinned, /*non_blocking=*/true); });
  }
  return d;
}

}  // namespace fsdp
