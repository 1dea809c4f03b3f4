// fsdp::optim::AdamW (ATen's fused kernel) against LibTorch's torch::optim::AdamW, the independent
// reference: the same parameters and gradients for 50 steps give the same parameters and moments
// to fp32 rounding, with weight decay in one group and not the other, with amsgrad, on 1-D views
// of one flat buffer (what FSDP's optimizer sees) and on whole tensors.
#include <fsdp/fused_adamw.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

struct Model {
  // Views into one flat buffer, as FSDP's shards, plus a tensor of its own.
  explicit Model(uint64_t seed) {
    torch::manual_seed(seed);
    flat = torch::randn({3 * 17 + 5});
    matrices = {flat.narrow(0, 0, 3 * 17).view({3, 17})};
    vectors = {flat.narrow(0, 3 * 17, 5), torch::randn({11})};
  }
  std::vector<torch::Tensor> all() const { return {matrices[0], vectors[0], vectors[1]}; }
  torch::Tensor flat;
  std::vector<torch::Tensor> matrices, vectors;
};

std::vector<torch::optim::OptimizerParamGroup> groups(const Model& m, bool amsgrad) {
  auto decay = AdamWOptions(3e-2).betas({0.9, 0.95}).weight_decay(0.1).amsgrad(amsgrad);
  auto no_decay = decay;
  no_decay.weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> out;
  out.emplace_back(m.matrices, std::make_unique<AdamWOptions>(decay));
  out.emplace_back(m.vectors, std::make_unique<AdamWOptions>(no_decay));
  return out;
}

const AdamWParamState& state(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  return static_cast<const AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl()));
}

void expect_close(const torch::Tensor& fused, const torch::Tensor& reference, const char* what,
                  int step) {
  // fp32 rounding: each step's update differs by a few ulps; AdamW's normalised step keeps them
  // from growing, so 50 steps stay within ~1e-6 of values of order 1.
  const double diff = (fused - reference).abs().max().item<double>();
  const double scale = reference.abs().max().item<double>() + 1e-12;
  EXPECT_LT(diff, 2e-6 * std::max(1.0, scale)) << what << " after step " << step;
}

void run_against_libtorch(bool amsgrad) {
  Model a(1), b(1);
  fsdp::optim::AdamW fused(groups(a, amsgrad), AdamWOptions(3e-2));
  torch::optim::AdamW reference(groups(b, amsgrad), AdamWOptions(3e-2));
  torch::manual_seed(2);
  for (int step = 1; step <= 50; ++step) {
    for (size_t i = 0; i < a.all().size(); ++i) {
      const auto grad = torch::randn(a.all()[i].sizes()) * (i + 1);
      a.all()[i].mutable_grad() = grad.clone();
      b.all()[i].mutable_grad() = grad.clone();
    }
    fused.step();
    reference.step();
    for (size_t i = 0; i < a.all().size(); ++i) {
      expect_close(a.all()[i], b.all()[i], "parameter", step);
      const auto& sa = state(fused, a.all()[i]);
      const auto& sb = state(reference, b.all()[i]);
      EXPECT_EQ(sa.step(), sb.step());
      expect_close(sa.exp_avg(), sb.exp_avg(), "exp_avg", step);
      expect_close(sa.exp_avg_sq(), sb.exp_avg_sq(), "exp_avg_sq", step);
      if (amsgrad) expect_close(sa.max_exp_avg_sq(), sb.max_exp_avg_sq(), "max_exp_avg_sq", step);
    }
  }
  // The updates were real: the parameters moved far beyond the tolerance.
  EXPECT_GT((a.flat - Model(1).flat).abs().max().item<double>(), 0.5);
}

// One step of each optimizer on the same random gradients.
void step_both_with_the_same_grads(const Model& a, torch::optim::AdamW& fused, const Model& b,
                                   torch::optim::AdamW& reference) {
  for (size_t i = 0; i < a.all().size(); ++i) {
    const auto grad = torch::randn(a.all()[i].sizes());
    a.all()[i].mutable_grad() = grad.clone();
    b.all()[i].mutable_grad() = grad.clone();
  }
  fused.step();
  reference.step();
}

// A fused AdamW and LibTorch's (no amsgrad), each over its own copy of one model; gradients drawn
// from `grad_seed`.
struct Twins {
  explicit Twins(uint64_t grad_seed)
      : a(1), b(1), fused(groups(a, false), AdamWOptions(3e-2)), reference(groups(b, false), AdamWOptions(3e-2)) {
    torch::manual_seed(grad_seed);
  }
  void step_with_the_same_grads() { step_both_with_the_same_grads(a, fused, b, reference); }
  Model a, b;
  fsdp::optim::AdamW fused;
  torch::optim::AdamW reference;
};

}  // namespace

TEST(FusedAdamW, FiftyStepsMatchLibTorchsAdamW) { run_against_libtorch(/*amsgrad=*/false); }

TEST(FusedAdamW, FiftyStepsMatchLibTorchsAdamWWithAmsgrad) { run_against_libtorch(/*amsgrad=*/true); }

// A state whose step was set from outside (a checkpoint loaded, or saved by LibTorch's AdamW)
// continues from that step: the bias correction of step 11, not of step 2.
TEST(FusedAdamW, ContinuesFromAStepSetByACheckpoint) {
  Twins t(3);
  auto& [a, b, fused, reference] = t;
  t.step_with_the_same_grads();
  for (auto* optimizer : {static_cast<torch::optim::AdamW*>(&fused), &reference}) {
    for (auto& [key, s] : optimizer->state()) static_cast<AdamWParamState&>(*s).step(10);
  }
  t.step_with_the_same_grads();
  for (size_t i = 0; i < a.all().size(); ++i) {
    EXPECT_EQ(state(fused, a.all()[i]).step(), 11);
    expect_close(a.all()[i], b.all()[i], "parameter", 11);
  }
}

// Parameters at different step counts in one step (one restored from a checkpoint at step 10,
// the others at step 1) each get their own count's bias correction, although the optimizer
// keeps one step tensor per count rather than one per parameter.
TEST(FusedAdamW, ParametersAtDifferentStepsEachUseTheirOwnCount) {
  Twins t(5);
  auto& [a, b, fused, reference] = t;
  t.step_with_the_same_grads();
  for (auto* optimizer : {static_cast<torch::optim::AdamW*>(&fused), &reference}) {
    // The second of its group: one kernel call steps it with a parameter at step 1.
    const torch::Tensor restored = optimizer == &reference ? b.all()[2] : a.all()[2];
    static_cast<AdamWParamState&>(*optimizer->state().at(restored.unsafeGetTensorImpl())).step(10);
  }
  for (int step = 2; step <= 4; ++step) {
    t.step_with_the_same_grads();
    for (size_t i = 0; i < a.all().size(); ++i) {
      EXPECT_EQ(state(fused, a.all()[i]).step(), i == 2 ? step + 9 : step);
      expect_close(a.all()[i], b.all()[i], "parameter", step);
    }
  }
}

// ShardedGradScaler's path (StepsScaledGradients): step_scaled(s) on gradients multiplied by s
// steps as step() on the gradients themselves, and leaves the gradients divided. s = 3 is not a
// power of two, so the two agree to rounding rather than bitwise.
TEST(FusedAdamW, StepScaledDividesTheGradientsByTheScale) {
  constexpr double scale = 3.0;
  Model a(1), b(1);
  fsdp::optim::AdamW scaled(groups(a, false), AdamWOptions(3e-2));
  fsdp::optim::AdamW plain(groups(b, false), AdamWOptions(3e-2));
  torch::manual_seed(4);
  for (int step = 1; step <= 5; ++step) {
    for (size_t i = 0; i < a.all().size(); ++i) {
      const auto grad = torch::randn(a.all()[i].sizes());
      a.all()[i].mutable_grad() = grad * scale;
      b.all()[i].mutable_grad() = grad.clone();
    }
    scaled.step_scaled(scale);
    plain.step();
    for (size_t i = 0; i < a.all().size(); ++i) {
      expect_close(a.all()[i], b.all()[i], "parameter", step);
      expect_close(a.all()[i].grad(), b.all()[i].grad(), "gradient left behind", step);
      EXPECT_EQ(state(scaled, a.all()[i]).step(), step);
    }
  }
  EXPECT_THROW(scaled.step_scaled(0), c10::Error);
}
