// Porting a LibTorch program: a unit is declared, built and registered as the holder it replaces
// (fsdp::Unit<torch::nn::Linear>(784, 64), register_module taking it), a model kept in a
// std::shared_ptr shards, another method than forward runs through its unit (Unit::call), and
// SummonFullParams gives every rank the whole model for a rank-local evaluation, edits and
// torch::save. Each is compared with the same program written in plain LibTorch.
#include "dist_env.h"
#include "error_of.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>

#include <unistd.h>

namespace fsdp_test {
namespace {

// mnist's style: holders declared {nullptr}, registered in the constructor, called with ->forward.
struct PortNetImpl : torch::nn::Module {
  PortNetImpl() {
    fc1 = register_module("fc1", fsdp::Unit<torch::nn::Linear>(9, 17));
    bn = register_module("bn", torch::nn::BatchNorm1d(17));
    fc2 = register_module("fc2", fsdp::Unit<torch::nn::Linear>(torch::nn::LinearOptions(17, 5).bias(false)));
    head = register_module("head", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn->forward(fc1->forward(x)));
    return head->forward(torch::tanh(fc2->forward(x)));
  }
  // Through the units: another method than forward, using fc2's parameters.
  torch::Tensor decode(torch::Tensor h, double scale) { return fc2->forward(h) * scale; }
  fsdp::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(PortNet);

// The same program in plain LibTorch: the reference, sharing nothing with fsdp.
struct PlainNetImpl : torch::nn::Module {
  PlainNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(9, 17));
    bn = register_module("bn", torch::nn::BatchNorm1d(17));
    fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(17, 5).bias(false)));
    head = register_module("head", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn->forward(fc1->forward(x)));
    return head->forward(torch::tanh(fc2->forward(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(PlainNet);

// A generator whose sampling method is not forward (dcgan's style).
struct SamplerImpl : torch::nn::Module {
  SamplerImpl() { fc = register_module("fc", torch::nn::Linear(4, 6)); }
  torch::Tensor forward(torch::Tensor z) { return torch::tanh(fc->forward(z)); }
  torch::Tensor sample(int64_t n, double temperature) {
    auto gen = at::detail::createCPUGenerator(77);
    return forward(torch::randn({n, 4}, gen) * temperature);
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Sampler);

struct SamplerNetImpl : torch::nn::Module {
  SamplerNetImpl() {
    sampler = register_module("sampler", fsdp::Unit<Sampler>(Sampler()));
    scale = register_parameter("scale", torch::ones({6}));
  }
  torch::Tensor forward(int64_t n) { return sampler.call(&SamplerImpl::sample, n, 0.5) * scale; }
  fsdp::Unit<Sampler> sampler{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(SamplerNet);

torch::Tensor port_input(int64_t step) {
  auto gen = at::detail::createCPUGenerator(4000 + step);
  return torch::randn({6, 9}, gen);
}

// Every parameter and buffer of the sharded model, whole, against the plain model's by name.
void expect_same_state(fsdp::Unit<PortNet>& sharded, PlainNet& plain, double tolerance) {
  const auto full = fsdp::gather_full_params(sharded);
  auto expected = plain->named_parameters();
  for (const auto& item : plain->named_buffers()) expected.insert(item.key(), item.value());
  ASSERT_EQ(full.size(), expected.size());
  for (const auto& [name, tensor] : full) {
    ASSERT_TRUE(expected.contains(name)) << name;
    EXPECT_TRUE(torch::allclose(tensor, expected[name], tolerance, tolerance))
        << name << ": max difference " << (tensor - expected[name]).abs().max().item<double>();
  }
}

TEST(PortingApi, UnitsBuiltFromConstructorArgumentsAndRegisteredTrainLikeThePlainProgram) {
  torch::manual_seed(3);
  PortNet net;
  torch::manual_seed(3);
  PlainNet plain;
  EXPECT_TRUE(torch::equal(net->fc1->weight, plain->fc1->weight));  // the same draws
  EXPECT_FALSE(net->fc1.is_sharded());
  EXPECT_TRUE(torch::allclose(net->forward(port_input(0)), plain->forward(port_input(0))));  // pass-through
  auto model = fsdp::fully_shard(net, *dist().world);
  std::vector<std::string> units;
  for (const auto& unit : model.units()) units.push_back(unit.name);
  EXPECT_EQ(units, (std::vector<std::string>{"", "fc1", "fc2"}));  // the registered Units, no copies
  EXPECT_TRUE(net->fc1.is_sharded());
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD plain_optim(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t step = 0; step < 3; ++step) {  // every rank the same batch: the average is its gradient
    optim.zero_grad();
    model->forward(port_input(step)).pow(2).mean().backward();
    optim.step();
    plain_optim.zero_grad();
    plain->forward(port_input(step)).pow(2).mean().backward();
    plain_optim.step();
  }
  expect_same_state(model, plain, 1e-5);
}

// Two holders of one module (a copy kept elsewhere, register_module's result) are one unit: each
// call through either goes through it.
struct TwoHoldersImpl : torch::nn::Module {
  TwoHoldersImpl() {
    torch::nn::Linear shared(9, 3);
    first = register_module("shared", fsdp::Unit<torch::nn::Linear>(shared));
    second = fsdp::Unit<torch::nn::Linear>(shared);
  }
  torch::Tensor forward(torch::Tensor x) { return first(x) + second(x); }
  fsdp::Unit<torch::nn::Linear> first{nullptr}, second{nullptr};
};
TORCH_MODULE(TwoHolders);

TEST(PortingApi, TwoHoldersOfOneModuleAreOneUnit) {
  torch::manual_seed(4);
  TwoHolders net;
  const auto expected = net->forward(port_input(0)).detach();
  auto model = fsdp::fully_shard(net, *dist().world);
  EXPECT_EQ(model.units().size(), 2u);
  EXPECT_TRUE(net->first.is_sharded());
  EXPECT_TRUE(net->second.is_sharded());
  EXPECT_TRUE(torch::allclose(model->forward(port_input(0)), expected, 1e-6, 1e-6));
}

TEST(PortingApi, AModelKeptInASharedPtrShards) {
  torch::manual_seed(5);
  auto net = std::make_shared<PortNetImpl>();
  torch::manual_seed(5);
  PlainNet plain;
  auto model = fsdp::fully_shard(net, *dist().world);
  EXPECT_EQ(model.units().size(), 3u);
  EXPECT_TRUE(torch::allclose(model->forward(port_input(1)), plain->forward(port_input(1)), 1e-6, 1e-6));
}

TEST(PortingApi, AnotherMethodRunsThroughItsUnitAndItsGradientIsReduced) {
  torch::manual_seed(9);
  auto model = fsdp::fully_shard(SamplerNet(), *dist().world);
  torch::manual_seed(9);
  Sampler plain;
  const auto sampled = model->forward(3);
  const auto expected = plain->sample(3, 0.5);
  ASSERT_TRUE(torch::allclose(sampled, expected, 1e-6, 1e-6)) << sampled << expected;
  // The gradient, reduced into this rank's shards: one SGD step of rate 1 moves each parameter by
  // exactly its gradient, and the gathered parameters show it.
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(1.0));
  torch::optim::SGD plain_optim(plain->parameters(), torch::optim::SGDOptions(1.0));
  sampled.sum().backward();
  expected.sum().backward();
  optim.step();
  plain_optim.step();
  fsdp::SummonFullParams full(model);
  EXPECT_TRUE(torch::allclose(model->sampler->fc->weight, plain->fc->weight, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(model->sampler->fc->bias, plain->fc->bias, 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(plain->fc->bias, torch::zeros_like(plain->fc->bias)));
}

TEST(PortingApi, SummonFullParamsLetsOneRankEvaluateTheWholeModelAlone) {
  torch::manual_seed(11);
  auto model = fsdp::fully_shard(PortNet(), *dist().world);
  model->eval();
  torch::Tensor sharded_output;
  {
    torch::NoGradGuard no_grad;
    sharded_output = model->forward(port_input(2));  // every rank: collectives
  }
  const auto full = fsdp::gather_full_params(model);
  {
    fsdp::SummonFullParams whole(model);
    const auto params = model->named_parameters();
    for (const auto& [name, tensor] : full) {
      if (!params.contains(name)) continue;  // a buffer
      const auto& param = params[name];
      EXPECT_EQ(param.sizes(), tensor.sizes()) << name;
      EXPECT_TRUE(torch::equal(param, tensor)) << name;
    }
    EXPECT_FALSE(at::GradMode::is_enabled());
    if (dist().rank() == 0) {  // alone: a collective here would wait for the other ranks forever
      EXPECT_TRUE(torch::allclose(model->forward(port_input(2)), sharded_output, 1e-6, 1e-6));
    }
  }
  EXPECT_TRUE(at::GradMode::is_enabled());
  if (dist().world_size() > 1) {
    for (const auto& p : model->parameters()) EXPECT_EQ(p.dim(), 1);  // the shards again
  }
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(model->forward(port_input(2)), sharded_output, 1e-6, 1e-6));
}

TEST(PortingApi, EditsInsideSummonFullParamsAreWrittenBackAndTrainingGoesOn) {
  torch::manual_seed(13);
  auto model = fsdp::fully_shard(PortNet(), *dist().world);
  torch::manual_seed(13);
  PlainNet plain;
  // SGD, not Adam: fc1.bias feeds a BatchNorm, so its true gradient is 0 and Adam's normalised
  // step would turn rounding noise into steps of the full learning rate.
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD plain_optim(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto step = [&](int64_t i) {
    optim.zero_grad();
    model->forward(port_input(i)).pow(2).mean().backward();
    optim.step();
    plain_optim.zero_grad();
    plain->forward(port_input(i)).pow(2).mean().backward();
    plain_optim.step();
  };
  step(0);
  {
    fsdp::SummonFullParams whole(model);
    model->fc2->weight.mul_(0.5);  // every rank the same edit
    model->head->bias.fill_(0.25);
  }
  {
    torch::NoGradGuard no_grad;
    plain->fc2->weight.mul_(0.5);
    plain->head->bias.fill_(0.25);
  }
  expect_same_state(model, plain, 1e-6);
  {
    fsdp::SummonFullParams whole(model, /*writeback=*/false);
    model->fc2->weight.mul_(100);  // dropped
  }
  expect_same_state(model, plain, 1e-6);
  step(1);  // the optimizer's parameters are the model's again, with their state
  step(2);
  expect_same_state(model, plain, 1e-5);
}

TEST(PortingApi, TorchSaveInsideSummonFullParamsWritesTheWholeModel) {
  torch::manual_seed(17);
  auto model = fsdp::fully_shard(PortNet(), *dist().world);
  const auto path = std::filesystem::temp_directory_path() /
                    ("fsdp-port-save-" + std::to_string(::getpid()) + ".pt");
  torch::Tensor expected;
  {
    fsdp::SummonFullParams whole(model);
    if (dist().rank() == 0) {
      model->eval();
      expected = model->forward(port_input(4));
      torch::save(model, path.string());
      model->train();
    }
  }
  if (dist().rank() != 0) return;
  PortNet loaded;  // unsharded: a plain LibTorch program reads the file
  torch::load(loaded, path.string());
  std::filesystem::remove(path);
  loaded->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(loaded->forward(port_input(4)), expected, 1e-6, 1e-6));
}

// An evaluation under grad mode leaves the root unsharded for a backward that may never come: the
// scope reshards it first, so an edit reaches the next forward, and a backward that does come
// still gives the step of the plain program.
TEST(PortingApi, SummonFullParamsAfterAForwardWithoutItsBackwardKeepsEditsAndTheStep) {
  torch::manual_seed(19);
  auto model = fsdp::fully_shard(PortNet(), *dist().world);
  torch::manual_seed(19);
  PlainNet plain;
  model->eval();
  plain->eval();
  model->forward(port_input(5));  // grad mode, no backward: the root stays unsharded
  {
    fsdp::SummonFullParams whole(model);
    model->head->weight.mul_(-1);
  }
  torch::NoGradGuard no_grad_plain_edit;
  plain->head->weight.mul_(-1);
  EXPECT_TRUE(torch::allclose(model->forward(port_input(6)), plain->forward(port_input(6)), 1e-6, 1e-6));
}

TEST(PortingApi, SummonFullParamsBetweenAForwardAndItsBackwardLeavesTheStepUnchanged) {
  torch::manual_seed(23);
  auto model = fsdp::fully_shard(PortNet(), *dist().world);
  torch::manual_seed(23);
  PlainNet plain;
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD plain_optim(plain->parameters(), torch::optim::SGDOptions(0.1));
  auto loss = model->forward(port_input(7)).pow(2).mean();
  {
    fsdp::SummonFullParams whole(model);
    EXPECT_TRUE(torch::equal(model->head->weight, plain->head->weight));
  }
  loss.backward();  // the root is gathered again for it
  optim.step();
  plain->forward(port_input(7)).pow(2).mean().backward();
  plain_optim.step();
  expect_same_state(model, plain, 1e-6);
}

// Public programs evaluate without a NoGradGuard, between backward and step: the evaluation
// reshards every unit ([Note: an evaluation forward reshards]), so the step meets shards and
// their gradients; a backward after an evaluation forward (a saliency map) gathers again.
TEST(PortingApi, AStepAfterAnEvaluationForwardUnderGradModeStepsTheShards) {
  torch::manual_seed(29);
  auto model = fsdp::fully_shard(PortNet(), *dist().world);
  torch::manual_seed(29);
  PlainNet plain;
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD plain_optim(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model->forward(port_input(0)).pow(2).mean().backward();
  plain->forward(port_input(0)).pow(2).mean().backward();
  model->eval();
  plain->eval();
  const auto evaluated = model->forward(port_input(8));  // grad mode, no backward
  EXPECT_TRUE(torch::allclose(evaluated, plain->forward(port_input(8)), 1e-6, 1e-6));
  model->train();
  plain->train();
  optim.step();
  plain_optim.step();
  expect_same_state(model, plain, 1e-5);
  optim.zero_grad();  // a backward through an evaluation forward
  plain_optim.zero_grad();
  model->eval();
  plain->eval();
  model->forward(port_input(9)).sum().backward();
  plain->forward(port_input(9)).sum().backward();
  optim.step();
  plain_optim.step();
  expect_same_state(model, plain, 1e-5);
}

}  // namespace
}  // namespace fsdp_test
