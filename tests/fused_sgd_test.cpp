// fsdp::optim::SGD (ATen's fused kernel) against LibTorch's torch::optim::SGD, the independent
// reference: the same parameters and gradients for 50 steps give the same parameters and momentum
// buffers to fp32 rounding: plain, with dampened momentum and weight decay, with Nesterov, on 1-D
// views of one flat buffer (what FSDP's optimizer sees) and on a tensor of its own.
#include <fsdp/fused_sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

struct Params {
  explicit Params(uint64_t seed) {
    torch::manual_seed(seed);
    flat = torch::randn({3 * 17 + 5});
    all = {flat.narrow(0, 0, 3 * 17).view({3, 17}), flat.narrow(0, 3 * 17, 5), torch::randn({11})};
  }
  torch::Tensor flat;
  std::vector<torch::Tensor> all;
};

void set_gradients(Params& a, Params& b, double scale_a = 1) {
  for (size_t i = 0; i < a.all.size(); ++i) {
    const auto grad = torch::randn(a.all[i].sizes()) * static_cast<double>(i + 1);
    a.all[i].mutable_grad() = grad * scale_a;
    b.all[i].mutable_grad() = grad.clone();
  }
}

const torch::Tensor& momentum_of(torch::optim::SGD& optimizer, const torch::Tensor& p) {
  return static_cast<const SGDParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).momentum_buffer();
}

void expect_close(const torch::Tensor& fused, const torch::Tensor& reference, const std::string& what) {
  const double diff = (fused - reference).abs().max().item<double>();
  EXPECT_LT(diff, 1e-5 * std::max(1.0, reference.abs().max().item<double>())) << what;
}

void run_against_libtorch(const SGDOptions& options) {
  Params a(1), b(1);
  fsdp::optim::SGD fused(a.all, options);
  torch::optim::SGD reference(b.all, options);
  torch::manual_seed(2);
  for (int step = 1; step <= 50; ++step) {
    set_gradients(a, b);
    fused.step();
    reference.step();
    for (size_t i = 0; i < a.all.size(); ++i) {
      const std::string where = " " + std::to_string(i) + " after step " + std::to_string(step);
      expect_close(a.all[i], b.all[i], "parameter" + where);
      if (options.momentum() != 0) expect_close(momentum_of(fused, a.all[i]), momentum_of(reference, b.all[i]), "momentum" + where);
    }
  }
  EXPECT_EQ(fused.state().size(), reference.state().size());  // momentum: one buffer each; else none
  EXPECT_GT((a.flat - Params(1).flat).abs().max().item<double>(), 0.1);  // the updates were real
}

TEST(FusedSGD, FiftyStepsMatchLibTorchsSGD) { run_against_libtorch(SGDOptions(0.01)); }

TEST(FusedSGD, FiftyStepsMatchLibTorchsSGDWithDampenedMomentumAndWeightDecay) {
  run_against_libtorch(SGDOptions(0.01).momentum(0.9).dampening(0.1).weight_decay(0.05));
}

TEST(FusedSGD, FiftyStepsMatchLibTorchsSGDWithNesterov) {
  run_against_libtorch(SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(0.05));
}

// A momentum buffer that exists (LibTorch's SGD made it, or a checkpoint loaded it) is continued,
// not restarted from the gradient.
TEST(FusedSGD, ContinuesTheMomentumOfLibTorchsSGD) {
  const auto options = SGDOptions(0.01).momentum(0.9).dampening(0.1);
  Params a(1), b(1);
  torch::optim::SGD reference(b.all, options);
  torch::manual_seed(3);
  for (int step = 0; step < 3; ++step) {
    set_gradients(a, b);
    reference.step();
  }
  fsdp::optim::SGD fused(a.all, options);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < a.all.size(); ++i) {
    a.all[i].copy_(b.all[i]);
    auto state = std::make_unique<SGDParamState>();
    state->momentum_buffer(momentum_of(reference, b.all[i]).clone());
    fused.state()[a.all[i].unsafeGetTensorImpl()] = std::move(state);
  }
  for (int step = 0; step < 3; ++step) {
    set_gradients(a, b);
    fused.step();
    reference.step();
  }
  for (size_t i = 0; i < a.all.size(); ++i) expect_close(a.all[i], b.all[i], "parameter " + std::to_string(i));
}

// ShardedGradScaler's path: step_scaled(s) on gradients multiplied by s steps as step() on the
// gradients themselves (SGD is not scale-invariant: a scale left in would move the parameters s
// times as far) and leaves the gradients divided.
TEST(FusedSGD, StepScaledDividesTheGradientsByTheScale) {
  constexpr double scale = 1024;
  const auto options = SGDOptions(0.01).momentum(0.9);
  Params a(1), b(1);
  fsdp::optim::SGD scaled(a.all, options), plain(b.all, options);
  torch::manual_seed(4);
  for (int step = 0; step < 3; ++step) {
    set_gradients(a, b, scale);
    scaled.step_scaled(scale);
    plain.step();
    for (size_t i = 0; i < a.all.size(); ++i) {
      expect_close(a.all[i], b.all[i], "parameter " + std::to_string(i));
      expect_close(a.all[i].grad(), b.all[i].grad(), "gradient left behind " + std::to_string(i));
    }
  }
}

}  // namespace
