// A sharded checkpoint resumes the optimizer as torch::load of a torch::save'd optimizer does:
// each param group's options (an lr schedule's learning rate, betas, momentum...) come back, so
// a run saved at step kSavedAt and resumed ends bitwise where the run that never stopped ends,
// for every optimizer checkpoints know, with two param groups and an lr schedule; the resuming
// program builds its optimizer with other options, which the checkpoint's replace.
// save_checkpoint's step comes back from load_sharded; an optimizer grouped otherwise is refused
// naming both counts; a tensor the optimizer holds outside the model is refused at save, before
// anything is written.
#include "dist_env.h"
#include "shared_folder.h"
#include "error_of.h"
#include "test_models.h"

#include <fsdp/checkpoint.h>
#include <fsdp/fused_adamw.h>
#include <fsdp/fused_sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <unistd.h>

namespace fsdp_test {
namespace {

namespace fs = std::filesystem;
namespace o = torch::optim;

constexpr int kSteps = 6;
constexpr int kSavedAt = 3;

BatchNormNet fresh_net() {
  torch::manual_seed(11);
  return BatchNormNet();
}

// Two groups, as a program that decays weights only builds them: weights, then biases and
// BatchNorm's affine parameters at half the learning rate.
using Named = torch::OrderedDict<std::string, torch::Tensor>;

std::vector<o::OptimizerParamGroup> two_groups(const Named& params, const o::OptimizerOptions& options) {
  std::vector<torch::Tensor> weights, others;
  for (const auto& item : params) {
    const bool matrix = item.value().dim() == 2;
    (matrix ? weights : others).push_back(item.value());
  }
  auto halved = options.clone();
  halved->set_lr(options.get_lr() / 2);
  std::vector<o::OptimizerParamGroup> groups;
  groups.emplace_back(weights, options.clone());
  groups.emplace_back(others, std::move(halved));
  return groups;
}

// The saved run's options (`saved`) and, differing in every option, the resuming program's.
struct OptimizerCase {
  const char* name;
  std::function<std::unique_ptr<o::Optimizer>(const Named&, bool saved)> make;
};

template <class Optimizer, class Options>
std::function<std::unique_ptr<o::Optimizer>(const Named&, bool)> maker(Options saved, Options other) {
  return [=](const Named& params, bool is_saved) -> std::unique_ptr<o::Optimizer> {
    return std::make_unique<Optimizer>(two_groups(params, is_saved ? saved : other), is_saved ? saved : other);
  };
}

std::vector<OptimizerCase> cases() {
  return {
      {"sgd", maker<o::SGD>(o::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-3),
                            o::SGDOptions(0.5).momentum(0.5).nesterov(true))},
      {"adam", maker<o::Adam>(o::AdamOptions(0.01).betas({0.8, 0.99}).eps(1e-6).weight_decay(1e-2).amsgrad(true),
                              o::AdamOptions(0.03))},
      {"adamw", maker<o::AdamW>(o::AdamWOptions(0.01).betas({0.85, 0.98}).eps(1e-7).weight_decay(0.1),
                                o::AdamWOptions(0.02).amsgrad(true))},
      {"rmsprop", maker<o::RMSprop>(o::RMSpropOptions(0.01).alpha(0.9).eps(1e-6).momentum(0.5).centered(true),
                                    o::RMSpropOptions(0.05).weight_decay(1e-2))},
      {"adagrad", maker<o::Adagrad>(o::AdagradOptions(0.1).lr_decay(0.01).weight_decay(1e-3).eps(1e-8),
                                    o::AdagradOptions(0.3))},
      {"fused_adamw", maker<fsdp::optim::AdamW>(o::AdamWOptions(0.01).betas({0.8, 0.95}).weight_decay(0.05),
                                                o::AdamWOptions(0.02))},
      {"fused_sgd", maker<fsdp::optim::SGD>(o::SGDOptions(0.1).momentum(0.8).weight_decay(1e-3),
                                            o::SGDOptions(0.3))},
  };
}

// Steps [first, last) on the same batches on every rank, the learning rate of every group
// multiplied by 0.7 after each (an exponential schedule: from whatever lr the group holds).
template <class Model>
void train(Model& model, o::Optimizer& optimizer, int first, int last) {
  for (int step = first; step < last; ++step) {
    auto gen = at::detail::createCPUGenerator(500 + step);
    const auto x = torch::randn({8, 5}, gen), y = torch::randn({8, 3}, gen);
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
    for (auto& group : optimizer.param_groups()) group.options().set_lr(group.options().get_lr() * 0.7);
  }
}

void expect_bitwise_equal(const fsdp::NamedTensors& got, const fsdp::NamedTensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << what << ": " << got[i].first;
  }
}

TEST(CheckpointOptions, EveryOptimizerResumesWithItsScheduledOptionsBitwise) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto straight = fsdp::fully_shard(fresh_net(), *dist().world);
    auto straight_optimizer = c.make(straight->named_parameters(), true);
    train(straight, *straight_optimizer, 0, kSteps);
    const auto expected = fsdp::gather_full_params(straight);

    const std::string dir = shared_folder("checkpoint-options", std::string("resume-") + c.name);
    double lr_at_save = 0;
    {
      auto model = fsdp::fully_shard(fresh_net(), *dist().world);
      auto optimizer = c.make(model->named_parameters(), true);
      train(model, *optimizer, 0, kSavedAt);
      lr_at_save = optimizer->param_groups()[1].options().get_lr();
      fsdp::save_checkpoint(model, *optimizer, dir, kSavedAt);  // no extra: the step alone
    }
    auto model = fsdp::fully_shard(fresh_net(), *dist().world);
    auto optimizer = c.make(model->named_parameters(), false);  // other options: the checkpoint's must replace them
    const nlohmann::json meta = fsdp::load_sharded(model, *optimizer, fsdp::latest_checkpoint(dir));
    EXPECT_EQ(meta.value("step", 0), kSavedAt) << meta.dump();
    EXPECT_EQ(optimizer->param_groups()[1].options().get_lr(), lr_at_save);
    train(model, *optimizer, kSavedAt, kSteps);
    expect_bitwise_equal(fsdp::gather_full_params(model), expected, c.name);
    barrier();
    if (dist().rank() == 0) fs::remove_all(dir);
  }
}

TEST(CheckpointOptions, AnOptimizerWithAnotherNumberOfParamGroupsIsRefusedNamingBoth) {
  const std::string dir = shared_folder("checkpoint-options", "groups");
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto optimizer = std::make_unique<o::AdamW>(two_groups(model->named_parameters(), o::AdamWOptions(0.01)), o::AdamWOptions(0.01));
  train(model, *optimizer, 0, 1);
  fsdp::save_checkpoint(model, *optimizer, dir, 1);

  auto resumed = fsdp::fully_shard(fresh_net(), *dist().world);
  o::AdamW one_group(resumed->parameters(), o::AdamWOptions(0.01));
  const auto before = fsdp::gather_full_params(resumed);
  const std::string message = error_of([&] { fsdp::load_sharded(resumed, one_group, fsdp::latest_checkpoint(dir)); });
  EXPECT_NE(message.find("the saved optimizer has 2 param group(s) but the program's has 1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("build the optimizer with the param groups of the saved run"), std::string::npos) << message;
  expect_bitwise_equal(fsdp::gather_full_params(resumed), before, "a refused load changes nothing");
  EXPECT_TRUE(one_group.state().empty());
  barrier();
  if (dist().rank() == 0) fs::remove_all(dir);
}

TEST(CheckpointOptions, AGroupHoldingOtherParametersIsRefusedNamingOne) {
  const std::string dir = shared_folder("checkpoint-options", "members");
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto optimizer = std::make_unique<o::SGD>(two_groups(model->named_parameters(), o::SGDOptions(0.1)), o::SGDOptions(0.1));
  fsdp::save_checkpoint(model, *optimizer, dir, 1);

  auto resumed = fsdp::fully_shard(fresh_net(), *dist().world);
  std::vector<torch::Tensor> first, second;  // the head's bias moved into the first group
  for (const auto& item : resumed->named_parameters()) {
    (item.value().dim() == 2 || item.key() == "head.bias" ? first : second).push_back(item.value());
  }
  std::vector<o::OptimizerParamGroup> groups;
  groups.emplace_back(first, std::make_unique<o::SGDOptions>(0.1));
  groups.emplace_back(second, std::make_unique<o::SGDOptions>(0.1));
  o::SGD regrouped(groups, o::SGDOptions(0.1));
  const std::string message = error_of([&] { fsdp::load_sharded(resumed, regrouped, fsdp::latest_checkpoint(dir)); });
  EXPECT_NE(message.find("param group 0 of the program's optimizer holds 'head.bias'"), std::string::npos) << message;
  barrier();
  if (dist().rank() == 0) fs::remove_all(dir);
}

TEST(CheckpointOptions, ATensorOutsideTheModelIsRefusedAtSaveBeforeAnythingIsWritten) {
  const std::string dir = shared_folder("checkpoint-options", "outside");
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  o::Adam optimizer(model->parameters(), o::AdamOptions(0.01));
  fsdp::save_checkpoint(model, optimizer, dir, 1);
  // A learnable temperature that the program forgot to register in its module.
  torch::Tensor temperature = torch::ones({2, 3}, torch::requires_grad());
  optimizer.param_groups()[0].params().push_back(temperature);
  const size_t position = optimizer.param_groups()[0].params().size() - 1;

  const std::string message = error_of([&] { fsdp::save_checkpoint(model, optimizer, dir, 2); });
  EXPECT_NE(message.find("param group 0 holds, at position " + std::to_string(position) +
                         ", a tensor of shape [2, 3] that is not a parameter of the model"),
            std::string::npos) << message;
  EXPECT_NE(message.find("register_parameter"), std::string::npos) << message;
  barrier();
  EXPECT_FALSE(fs::exists(dir + "/step-00000002")) << "nothing written";
  EXPECT_EQ(fsdp::latest_checkpoint(dir), dir + "/step-00000001");
  barrier();
  if (dist().rank() == 0) fs::remove_all(dir);
}

TEST(CheckpointOptions, SaveCheckpointsStepComesBackAndAnotherStepInExtraIsRefused) {
  const std::string dir = shared_folder("checkpoint-options", "step");
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  o::SGD optimizer(model->parameters(), o::SGDOptions(0.1));
  fsdp::save_checkpoint(model, optimizer, dir, 4, {{"seed", 9}});
  const nlohmann::json meta = fsdp::load_sharded(model, optimizer, fsdp::latest_checkpoint(dir));
  EXPECT_EQ(meta, nlohmann::json({{"seed", 9}, {"step", 4}}));
  const std::string message = error_of([&] { fsdp::save_checkpoint(model, optimizer, dir, 5, {{"step", 6}}); });
  EXPECT_NE(message.find("extra.step is 6 but the step saved is 5"), std::string::npos) << message;
  barrier();
  if (dist().rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdp_test
