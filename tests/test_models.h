#pragma once
// Models for the multi-rank tests, with the awkward cases of a real model: sizes not divisible by
// the world size, a unit holding one scalar, a unit with no parameter but a buffer, a root with
// parameters of its own.

#include <fsdp/fsdp.h>

#include <torch/torch.h>

namespace fsdp_test {

struct ScaleImpl : torch::nn::Module {  // one scalar parameter
  ScaleImpl() { scale = register_parameter("scale", torch::full({}, 1.5)); }
  torch::Tensor forward(const torch::Tensor& x) { return x * scale; }
  torch::Tensor scale;
};
TORCH_MODULE(Scale);

struct ShiftImpl : torch::nn::Module {  // no parameter, one buffer
  explicit ShiftImpl(int64_t n) { shift = register_buffer("shift", torch::linspace(-0.5, 0.5, n)); }
  torch::Tensor forward(const torch::Tensor& x) { return x + shift; }
  torch::Tensor shift;
};
TORCH_MODULE(Shift);

struct OddNetImpl : torch::nn::Module {
  OddNetImpl() {
    first = register_module("first", torch::nn::Linear(7, 13));       // 104 elements
    scale_unit = register_module("scale_unit", Scale());             // 1 element
    shift_unit = register_module("shift_unit", Shift(13));           // 0 elements
    second = register_module("second", torch::nn::Linear(torch::nn::LinearOptions(13, 7).bias(false)));
    head = register_module("head", torch::nn::Linear(7, 3));          // root: 24 elements
    gain = register_parameter("gain", torch::ones({3}));              // root: 3 elements
    first_unit = first;
    scale_call = scale_unit;
    shift_call = shift_unit;
    second_unit = second;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(first_unit(x));
    h = shift_call(scale_call(h));
    h = torch::tanh(second_unit(h));
    return head(h) * gain;
  }
  torch::nn::Linear first{nullptr}, second{nullptr}, head{nullptr};
  Scale scale_unit{nullptr};
  Shift shift_unit{nullptr};
  torch::Tensor gain;
  fsdp::Unit<torch::nn::Linear> first_unit, second_unit;
  fsdp::Unit<Scale> scale_call;
  fsdp::Unit<Shift> shift_call;
};
TORCH_MODULE(OddNet);

inline OddNet make_odd_net(uint64_t seed) {
  torch::manual_seed(seed);
  return OddNet();
}

/// The global batch of `step`: inputs [rows, 7] and targets [rows, 3], the same on every rank.
inline std::pair<torch::Tensor, torch::Tensor> odd_batch(int64_t step, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return {torch::randn({rows, 7}, gen), torch::randn({rows, 3}, gen)};
}

/// A block with BatchNorm (buffers: running_mean, running_var, num_batches_tracked) in a unit
/// "block", and a head: the checkpoints of tests/checkpoint_state_test.cpp and
/// tests/checkpoint_state_tool.cpp. Inputs [rows, 5], outputs [rows, 3].
struct BatchNormBlockImpl : torch::nn::Module {
  BatchNormBlockImpl() {
    // No bias before BatchNorm: its gradient would be rounding noise alone (BatchNorm removes a
    // constant shift), which Adam-like optimizers scale up to full steps. 35 elements: uneven
    // shards at W = 2 and 3.
    fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(5, 7).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm1d(7));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(bn(fc(x))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BatchNormBlock);

struct BatchNormNetImpl : torch::nn::Module {
  BatchNormNetImpl() {
    block = register_module("block", BatchNormBlock());
    head = register_module("head", torch::nn::Linear(7, 3));
    block_unit = block;
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(block_unit(x)); }
  BatchNormBlock block{nullptr};
  torch::nn::Linear head{nullptr};
  fsdp::Unit<BatchNormBlock> block_unit;
};
TORCH_MODULE(BatchNormNet);

}  // namespace fsdp_test
