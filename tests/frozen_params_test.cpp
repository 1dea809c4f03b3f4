// Frozen parameters inside units (not reduced, not updated, no gradient memory) and tied
// parameters (shared within a unit: trained once; across units: rejected naming both).
#include "dist_env.h"
#include "param_compare.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace fsdp_test {
namespace {

struct PairImpl : torch::nn::Module {  // a unit with a frozen and a trainable layer
  PairImpl() {
    frozen = register_module("frozen", torch::nn::Linear(8, 8));
    trained = register_module("trained", torch::nn::Linear(8, 8));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return trained(torch::tanh(frozen(x))); }
  torch::nn::Linear frozen{nullptr}, trained{nullptr};
};
TORCH_MODULE(Pair);

struct FrozenNetImpl : torch::nn::Module {
  FrozenNetImpl() {
    first = register_module("first", torch::nn::Linear(6, 8));  // trainable unit
    pair = register_module("pair", Pair());                     // mixed unit
    middle = register_module("middle", torch::nn::Linear(8, 8));  // frozen unit mid-network
    head = register_module("head", torch::nn::Linear(8, 3));    // root
    for (auto& p : middle->parameters()) p.set_requires_grad(false);
    first_unit = first;
    pair_unit = pair;
    middle_unit = middle;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(first_unit(x));
    h = torch::tanh(pair_unit(h));
    h = torch::tanh(middle_unit(h));  // backward must still reach `first` and `pair` through it
    return head(h);
  }
  torch::nn::Linear first{nullptr}, middle{nullptr}, head{nullptr};
  Pair pair{nullptr};
  fsdp::Unit<torch::nn::Linear> first_unit, middle_unit;
  fsdp::Unit<Pair> pair_unit;
};
TORCH_MODULE(FrozenNet);

FrozenNet make_frozen_net() {
  torch::manual_seed(11);
  return FrozenNet();
}

std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  return {torch::randn({rows, 6}, gen), torch::randn({rows, 3}, gen)};
}

std::map<std::string, torch::Tensor> named(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : module.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

TEST(FrozenParams, AreNotReducedNotUpdatedAndHoldNoGradientMemory) {
  const int world = dist().world_size(), rank = dist().rank();
  const int steps = 3, rows = 2;
  auto reference = make_frozen_net();
  const auto initial = named(*reference);
  {
    torch::optim::AdamW optimizer(reference->parameters(),
                                  torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = batch(step, rows * world);
      optimizer.zero_grad();
      torch::mse_loss(reference(x), y).backward();
      optimizer.step();
    }
  }
  const auto reference_params = named(*reference);

  const int64_t before = fsdp::memory_stats().current_bytes;
  auto model = fsdp::fully_shard(make_frozen_net(), *dist().world);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  int64_t trainable_shards = 0, all_shards = 0, frozen_units = 0;
  for (const auto& unit : model.units()) {
    for (const auto& flat : unit.flats) {
      all_shards += flat.shard_numel;
      if (flat.trainable) trainable_shards += flat.shard_numel;
      frozen_units += !flat.trainable;
    }
  }
  EXPECT_EQ(frozen_units, 2);  // pair's frozen parameters, and middle
  const auto comm_before = fsdp::comm_stats();
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step, rows * world);
    optimizer.zero_grad();
    torch::mse_loss(model(x.narrow(0, rows * rank, rows)), y.narrow(0, rows * rank, rows)).backward();
    optimizer.step();
  }
  // Reduce-scatter moves the trainable flat parameters only: (W-1)·S·4 bytes each per step.
  EXPECT_EQ(fsdp::comm_stats().reduce_scatter_bytes - comm_before.reduce_scatter_bytes,
            steps * (world - 1) * trainable_shards * 4);

  // Parameter shards of every unit, gradient shards of the trainable ones, AdamW moments of the
  // trainable local pieces: nothing for the frozen parameters beyond their shards.
  int64_t local_trainable = 0;
  for (auto& p : model->parameters()) {
    if (p.requires_grad()) local_trainable += p.numel();
    if (!p.requires_grad()) {
      EXPECT_FALSE(p.grad().defined());
    }
  }
  const int64_t expected = 4 * all_shards + 4 * trainable_shards + 8 * local_trainable;
  const int64_t measured = fsdp::memory_stats().current_bytes - before;
  std::printf("persistent bytes per rank: %lld, expected %lld (+ AdamW step counters)\n",
              (long long)measured, (long long)expected);
  EXPECT_GE(measured, expected);
  EXPECT_LE(measured, expected + 1024);

  const auto full = fsdp::gather_full_params(model);
  expect_same_params(full, reference_params);
  for (const auto& [name, tensor] : full) {
    if (name.find("frozen") != std::string::npos || name.find("middle") != std::string::npos) {
      EXPECT_TRUE(torch::equal(tensor, initial.at(name))) << name << " was updated";
    } else {
      EXPECT_FALSE(torch::equal(tensor, initial.at(name))) << name << " did not train";
    }
  }
}

struct TiedPairImpl : torch::nn::Module {  // one Linear registered under two names
  TiedPairImpl() {
    encode = register_module("encode", torch::nn::Linear(6, 6));
    decode = register_module("decode", encode);
  }
  torch::Tensor forward(const torch::Tensor& x) { return decode(torch::tanh(encode(x))); }
  torch::nn::Linear encode{nullptr}, decode{nullptr};
};
TORCH_MODULE(TiedPair);

struct ProjectionImpl : torch::nn::Module {  // a Linear without bias, its weight given
  explicit ProjectionImpl(torch::Tensor w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(Projection);

struct TiedNetImpl : torch::nn::Module {
  explicit TiedNetImpl(bool across_units) {
    left = register_module("left", TiedPair());
    // Across units: the other unit registers left.encode's weight as its own.
    right = register_module("right", Projection(across_units ? left->encode->weight
                                                             : torch::randn({6, 6}) * 0.3));
    left_unit = left;
    right_unit = right;
  }
  torch::Tensor forward(const torch::Tensor& x) { return right_unit(left_unit(x)); }
  TiedPair left{nullptr};
  Projection right{nullptr};
  fsdp::Unit<TiedPair> left_unit;
  fsdp::Unit<Projection> right_unit;
};
TORCH_MODULE(TiedNet);

TEST(TiedParams, WithinAUnitTrainOnceLikeTheReference) {
  const int world = dist().world_size(), rank = dist().rank();
  torch::manual_seed(3);
  TiedNet reference(false);
  torch::manual_seed(3);
  auto model = fsdp::fully_shard(TiedNet(false), *dist().world);
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    auto gen = at::detail::createCPUGenerator(step);
    auto x = torch::randn({2 * world, 6}, gen), y = torch::randn({2 * world, 6}, gen);
    reference_optimizer.zero_grad();
    torch::mse_loss(reference(x), y).backward();
    reference_optimizer.step();
    optimizer.zero_grad();
    torch::mse_loss(model(x.narrow(0, 2 * rank, 2)), y.narrow(0, 2 * rank, 2)).backward();
    optimizer.step();
  }
  auto expected = named(*reference);  // holds both names of the tied tensor
  const auto full = fsdp::gather_full_params(model);
  EXPECT_EQ(full.size(), expected.size() - 2);  // the tie is sharded once, under its first name
  expected.erase("left.decode.weight");
  expected.erase("left.decode.bias");
  expect_same_params(full, expected);
}

TEST(TiedParams, AcrossUnitsAreRejectedNamingBoth) {
  std::string message;
  try {
    fsdp::fully_shard(TiedNet(true), *dist().world);
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  EXPECT_NE(message.find("'left.encode.weight' (unit 'left')"), std::string::npos) << message;
  EXPECT_NE(message.find("'right.weight' (unit 'right')"), std::string::npos) << message;
  EXPECT_NE(message.find("tied"), std::string::npos) << message;
}

}  // namespace
}  // namespace fsdp_test
