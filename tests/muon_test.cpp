// fsdp::optim::Muon on a sharded model as a training loop uses it: beside AdamW, under every
// strategy, mixed precision, gradient accumulation, clipping and frozen layers, following the
// same model trained unsharded; its momentum sharded; what it refuses, by name.
// (Bitwise equality with torch.optim.Muon itself: tests/muon_reference_e2e.py.)
#include "dist_env.h"
#include "error_of.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <sstream>

namespace fsdp_test {
namespace {

struct MuonBlockImpl : torch::nn::Module {
  MuonBlockImpl() {
    up = register_module("up", torch::nn::Linear(8, 12));
    down = register_module("down", torch::nn::Linear(12, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::tanh(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(MuonBlock);

// Two blocks and a frozen layer as units, a head in the root.
struct MuonModelImpl : torch::nn::Module {
  MuonModelImpl() {
    first = register_module("first", MuonBlock());
    frozen = register_module("frozen", torch::nn::Linear(8, 8));
    second = register_module("second", MuonBlock());
    head = register_module("head", torch::nn::Linear(8, 3));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
    first_unit = first;
    frozen_unit = frozen;
    second_unit = second;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head(second_unit(torch::tanh(frozen_unit(first_unit(x)))));
  }
  MuonBlock first{nullptr}, second{nullptr};
  torch::nn::Linear frozen{nullptr}, head{nullptr};
  fsdp::Unit<MuonBlock> first_unit, second_unit;
  fsdp::Unit<torch::nn::Linear> frozen_unit;
};
TORCH_MODULE(MuonModel);

MuonModel make_muon_model() {
  torch::manual_seed(51);
  return MuonModel();
}

std::pair<torch::Tensor, torch::Tensor> muon_batch(int64_t step, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(5100 + step);
  return {torch::randn({rows, 8}, gen), torch::randn({rows, 3}, gen)};
}

constexpr int64_t kRows = 4;      // per rank and micro-batch
constexpr int kMicroBatches = 2;  // gradient accumulation
constexpr double kMaxNorm = 0.5;  // clipping that clips (the first steps' norms are above it)

template <class Model>
std::map<std::string, torch::Tensor> params_of(Model& model) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// `steps` steps of Muon on the matrices and AdamW on the rest, each of `kMicroBatches` micro-batches
// of `rows` of the global batch (`rows(x)`: the rows this model sees), clipped by `clip`.
template <class Forward, class Rows, class Clip>
void train_steps(Forward forward, Rows rows, Clip clip, fsdp::optim::Muon& muon, torch::optim::AdamW& adamw,
                 int steps) {
  for (int step = 0; step < steps; ++step) {
    muon.zero_grad();
    adamw.zero_grad();
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      auto [x, y] = muon_batch(step * kMicroBatches + micro, kRows * dist().world_size());
      (torch::mse_loss(forward(rows(x)), rows(y)) / kMicroBatches).backward();
    }
    clip();
    muon.step();
    adamw.step();
  }
}

// The same steps on the unsharded model, with every rank's rows: the reference.
std::map<std::string, torch::Tensor> train_unsharded(int steps) {
  MuonModel model = make_muon_model();
  const auto split = fsdp::optim::split_for_muon(*model);
  fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
  torch::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(1e-3));
  train_steps([&](const torch::Tensor& x) { return model->forward(x); }, [](const torch::Tensor& t) { return t; },
              [&] { torch::nn::utils::clip_grad_norm_(model->parameters(), kMaxNorm); }, muon, adamw, steps);
  return params_of(*model);
}

struct ShardedRun {
  std::map<std::string, torch::Tensor> params;  // whole, gathered
  int64_t momentum_elements = 0;                // Muon's state held by this rank
  int64_t muon_elements = 0;                    // of the matrices Muon steps, whole
};

ShardedRun train_sharded(fsdp::FullyShardOptions options, int steps) {
  auto model = fsdp::fully_shard(make_muon_model(), *dist().world, options);
  const auto split = fsdp::optim::split_for_muon(*model);
  EXPECT_EQ(split.matrix_names, (std::vector<std::string>{"first.up.weight", "first.down.weight",
                                                          "second.up.weight", "second.down.weight"}));
  fsdp::optim::Muon muon(split.matrices, fsdp::optim::MuonOptions(0.02));
  torch::optim::AdamW adamw(split.others, torch::optim::AdamWOptions(1e-3));
  const int rank = dist().rank();
  train_steps([&](const torch::Tensor& x) { return model(x); },
              [&](const torch::Tensor& t) { return t.narrow(0, kRows * rank, kRows); },
              [&] { fsdp::clip_grad_norm_(model->parameters(), kMaxNorm); }, muon, adamw, steps);
  ShardedRun run;
  for (const auto& [name, t] : fsdp::gather_full_params(model)) run.params[name] = t;
  for (const auto& p : split.matrices) {
    const auto& state = static_cast<fsdp::optim::MuonParamState&>(*muon.state().at(p.unsafeGetTensorImpl()));
    run.momentum_elements += state.momentum_buffer().numel();
  }
  for (const auto& name : split.matrix_names) run.muon_elements += run.params.at(name).numel();
  return run;
}

// Momentum is sharded: the ranks' momentum buffers hold each element of Muon's matrices once
// (no-shard: every rank the whole).
void expect_momentum_sharded(const ShardedRun& run, fsdp::ShardingStrategy strategy) {
  auto held = torch::tensor({run.momentum_elements}, torch::kLong);
  fsdp::all_reduce_sum(*dist().world, held);
  const int64_t copies = strategy == fsdp::ShardingStrategy::NoShard ? dist().world_size() : 1;
  EXPECT_EQ(held.item<int64_t>(), copies * run.muon_elements);
}

void expect_close(const std::map<std::string, torch::Tensor>& got, const std::map<std::string, torch::Tensor>& want,
                  double tolerance) {
  for (const auto& [name, w] : want) {
    EXPECT_LT((got.at(name) - w).abs().max().item<double>(), tolerance) << name;
  }
}

TEST(Muon, ShardedTrainingFollowsTheUnshardedModelUnderEveryFeature) {
  constexpr int kSteps = 4;
  const auto reference = train_unsharded(kSteps);
  const auto initial = params_of(*make_muon_model());
  for (const auto& [name, want] : reference) {
    EXPECT_EQ(torch::equal(want, initial.at(name)), name.rfind("frozen", 0) == 0) << name;
  }
  using S = fsdp::ShardingStrategy;
  const auto bf16 = fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  // Under bf16 the reference is the no-shard run (every rank steps whole matrices, no exchange):
  // against fp32, Muon turns a bf16 backward's noise in a small gradient into a full-size step.
  const ShardedRun bf16_whole = train_sharded(fsdp::FullyShardOptions().strategy(S::NoShard).mixed_precision(bf16), kSteps);
  expect_close(bf16_whole.params, reference, 5e-2);
  for (S strategy : {S::FullShard, S::ShardGradOp, S::NoShard}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    const ShardedRun fp32 = train_sharded(fsdp::FullyShardOptions().strategy(strategy), kSteps);
    expect_close(fp32.params, reference, 1e-4);  // the sums of W ranks' gradients against one sum
    EXPECT_TRUE(torch::equal(fp32.params.at("frozen.weight"), initial.at("frozen.weight")));
    expect_momentum_sharded(fp32, strategy);
    const ShardedRun mixed = train_sharded(fsdp::FullyShardOptions().strategy(strategy).mixed_precision(bf16), kSteps);
    expect_close(mixed.params, bf16_whole.params, 1e-4);
    expect_momentum_sharded(mixed, strategy);
  }
}

// A program's own loop: LibTorch's StepLR halving Muon's lr each step, and at step 2 the scheduler
// made again (LibTorch's schedulers keep no state to save); with `through_torch_save`, Muon is
// also saved there with torch::save (each rank its pieces) and loaded with torch::load into a
// new Muon, which must go on as if uninterrupted: its momentum and its decayed lr restored.
std::map<std::string, torch::Tensor> train_with_schedule(bool through_torch_save) {
  constexpr int kSteps = 4, kRestart = 2;
  auto model = fsdp::fully_shard(make_muon_model(), *dist().world);
  const auto split = fsdp::optim::split_for_muon(*model);
  auto muon = std::make_unique<fsdp::optim::Muon>(split.matrices, fsdp::optim::MuonOptions(0.02));
  auto schedule = std::make_unique<torch::optim::StepLR>(*muon, /*step_size=*/1, /*gamma=*/0.5);
  const int rank = dist().rank();
  for (int step = 0; step < kSteps; ++step) {
    if (step == kRestart) {
      const double lr = muon->param_groups()[0].options().get_lr();
      EXPECT_DOUBLE_EQ(lr, 0.01);  // StepLR's first step() leaves the lr, the second halves it
      if (through_torch_save) {
        std::stringstream saved;
        torch::save(*muon, saved);
        muon = std::make_unique<fsdp::optim::Muon>(split.matrices, fsdp::optim::MuonOptions(0.02));
        torch::load(*muon, saved);
        EXPECT_DOUBLE_EQ(muon->param_groups()[0].options().get_lr(), lr);
      }
      schedule = std::make_unique<torch::optim::StepLR>(*muon, 1, 0.5);
    }
    muon->zero_grad();
    auto [x, y] = muon_batch(step, kRows * dist().world_size());
    torch::mse_loss(model(x.narrow(0, kRows * rank, kRows)), y.narrow(0, kRows * rank, kRows)).backward();
    muon->step();
    schedule->step();
  }
  return params_of(*model);
}

TEST(Muon, TorchSaveAndLoadResumeAScheduledRun) {
  const auto uninterrupted = train_with_schedule(/*through_torch_save=*/false);
  const auto resumed = train_with_schedule(/*through_torch_save=*/true);
  for (const auto& [name, want] : uninterrupted) EXPECT_TRUE(torch::equal(resumed.at(name), want)) << name;
}

// A public GPT's layout: its head called out_head, an attention block whose name ends in "head"
// too (multihead), a token embedding, a norm. Keller Jordan's split: Muon only for the hidden
// matrices (the rule the planner reads too: fsdp::optim::is_hidden_matrix).
struct PublicGptImpl : torch::nn::Module {
  PublicGptImpl() {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(16, 8));
    multihead = register_module("multihead", torch::nn::Linear(8, 24));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    out_head = register_module("out_head", torch::nn::Linear(8, 16));
  }
  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::Linear multihead{nullptr}, out_head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(PublicGpt);

TEST(Muon, SplitSendsEveryOutputHeadToAdamW) {
  PublicGpt model;
  const auto split = fsdp::optim::split_for_muon(*model);
  EXPECT_EQ(split.matrix_names, (std::vector<std::string>{"multihead.weight"}));
  EXPECT_EQ(split.other_names, (std::vector<std::string>{"tok_emb.weight", "multihead.bias", "norm.weight", "norm.bias",
                                                         "out_head.weight", "out_head.bias"}));
  EXPECT_FALSE(fsdp::optim::is_hidden_matrix("h.0.value_head.weight", {1, 8}, false));
  EXPECT_TRUE(fsdp::optim::is_hidden_matrix("h.0.overhead.weight", {4, 8}, false));
  EXPECT_FALSE(fsdp::optim::is_hidden_matrix("wte.weight", {16, 8}, /*embedding_module=*/true));
}

TEST(Muon, RefusesWhatItCannotStepByName) {
  auto model = fsdp::fully_shard(make_muon_model(), *dist().world);
  // A sharded bias is 1-D between steps like everything else: refused by its original shape.
  std::string error = error_of([&] { fsdp::optim::Muon muon({model->first->up->bias}); });
  EXPECT_NE(error.find("'first.up.bias' has shape [12]"), std::string::npos) << error;
  EXPECT_NE(error.find("split_for_muon"), std::string::npos) << error;
  error = error_of([&] { fsdp::optim::Muon muon({model->first->up->weight}, fsdp::optim::MuonOptions().adjust_lr_fn("rms")); });
  EXPECT_NE(error.find("adjust_lr_fn 'rms'"), std::string::npos) << error;
  // A gradient on some ranks only would pair the wrong pieces: refused, naming the parameter.
  if (dist().world_size() > 1) {
    fsdp::optim::Muon muon({model->first->up->weight, model->second->down->weight});
    model->first->up->weight.mutable_grad() = torch::zeros_like(model->first->up->weight);
    if (dist().rank() == 0) model->second->down->weight.mutable_grad() = torch::zeros_like(model->second->down->weight);
    error = error_of([&] { muon.step(); });
    EXPECT_NE(error.find("'second.down.weight' has a gradient on 1 of the"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace fsdp_test
