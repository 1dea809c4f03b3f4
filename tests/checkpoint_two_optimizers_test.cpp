// One model, two optimizers, one checkpoint ([Note: several optimizers, one checkpoint]):
// fsdp::optim::Muon steps the matrices of a small model with BatchNorm (block.fc.weight,
// head.weight) and fsdp::optim::AdamW the rest (BatchNorm's weight and bias, head.bias). Saved by
// W - 1 ranks (a subgroup of this job: W = 2 under dist_world3) and resumed by all W, the run ends
// where the same run at W, never interrupted, ends, within the checkpoint tests' bound (1e-5
// relative: checkpoint_state_test.cpp's): parameters, BatchNorm's statistics and both optimizers'
// state, with the options (lr after a schedule's decay, Muon's momentum, ns_steps...) that the
// saved run had reached. A parameter whose saved state is of the other optimizer is refused by
// name, either way; a parameter in both optimizers is refused at the save.
#include "dist_env.h"
#include "shared_folder.h"
#include "test_models.h"

#include <fsdp/checkpoint.h>
#include <fsdp/fused_adamw.h>
#include <fsdp/muon.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <unistd.h>

namespace fsdp_test {
namespace {

namespace fs = std::filesystem;
namespace o = torch::optim;
using Net = BatchNormNet;

constexpr int kSteps = 6;
constexpr int kSavedAt = 3;
constexpr int kDecayAt = 1;  // a schedule's one change, before the save: only the checkpoint carries it
constexpr double kBound = 1e-5;  // checkpoint_state_test.cpp's, relative to the largest element
const std::set<std::string> kMatrices{"block.fc.weight", "head.weight"};

Net fresh_net() {
  torch::manual_seed(11);
  return Net();
}

std::pair<torch::Tensor, torch::Tensor> batch(int step) {  // the same on every rank
  auto gen = at::detail::createCPUGenerator(500 + step);
  return {torch::randn({8, 5}, gen), torch::randn({8, 3}, gen)};
}

// The saved run's Muon options: none the default, so that each must come back from the checkpoint.
fsdp::optim::MuonOptions saved_muon_options() {
  return fsdp::optim::MuonOptions(0.02)
      .weight_decay(0.05)
      .momentum(0.9)
      .nesterov(false)
      .ns_coefficients(std::make_tuple(3.4, -4.7, 2.0))
      .eps(1e-6)
      .ns_steps(4)
      .adjust_lr_fn("match_rms_adamw");
}

// Muon over the matrices, AdamW over the rest, in that order.
struct TwoOptimizers {
  std::unique_ptr<fsdp::optim::Muon> muon;
  std::unique_ptr<fsdp::optim::AdamW> adamw;
  std::vector<o::Optimizer*> both() const { return {muon.get(), adamw.get()}; }
};

// `as_saved`: the saved run's options; otherwise the defaults, which a load must replace.
TwoOptimizers two_optimizers(const torch::OrderedDict<std::string, torch::Tensor>& params, bool as_saved) {
  std::vector<torch::Tensor> matrices, others;
  for (const auto& item : params) {
    (kMatrices.count(item.key()) ? matrices : others).push_back(item.value());
  }
  return {std::make_unique<fsdp::optim::Muon>(matrices, as_saved ? saved_muon_options() : fsdp::optim::MuonOptions()),
          std::make_unique<fsdp::optim::AdamW>(others, o::AdamWOptions(as_saved ? 0.01 : 0.001))};
}

void train(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
           const std::vector<o::Optimizer*>& optimizers, int first, int last) {
  for (int step = first; step < last; ++step) {
    if (step == kDecayAt) {
      for (auto* optimizer : optimizers) {
        for (auto& group : optimizer->param_groups()) group.options().set_lr(group.options().get_lr() * 0.5);
      }
    }
    auto [x, y] = batch(step);
    for (auto* optimizer : optimizers) optimizer->zero_grad();
    torch::mse_loss(forward(x), y).backward();
    for (auto* optimizer : optimizers) optimizer->step();
  }
}

// The largest difference between `got` and `want`, relative to want's largest element, over
// every name; both must hold the same names.
double worst_relative(const fsdp::NamedTensors& got, const fsdp::NamedTensors& want, const std::string& what) {
  std::map<std::string, torch::Tensor> expected(want.begin(), want.end());
  EXPECT_EQ(got.size(), expected.size()) << what << ": the same names";
  double worst = 0;
  for (const auto& [key, tensor] : got) {
    if (!expected.count(key)) {
      ADD_FAILURE() << what << ": " << key << " is not in the uninterrupted run's";
      continue;
    }
    const auto w = expected.at(key).to(torch::kDouble);
    const double diff = (tensor.to(torch::kDouble) - w).abs().max().item<double>() /
                        std::max(w.abs().max().item<double>(), 1e-12);
    EXPECT_LE(diff, kBound) << what << ": " << key;
    worst = std::max(worst, diff);
  }
  return worst;
}

// The first `savers` ranks train with Muon + AdamW to kSavedAt and save into `folder` (every rank
// returns once it is written).
void save_muon_and_adamw(const std::string& folder, int savers) {
  const int world = dist().world_size();
  std::vector<int> ranks(savers);
  for (int r = 0; r < savers; ++r) ranks[r] = r;
  if (dist().rank() < savers) {
    auto group = savers == world ? dist().world : dist().world->subgroup(ranks, "savers-" + folder);
    auto model = fsdp::fully_shard(fresh_net(), *group);
    auto two = two_optimizers(model->named_parameters(), /*as_saved=*/true);
    train([&](const torch::Tensor& x) { return model(x); }, two.both(), 0, kSavedAt);
    fsdp::save_sharded(model, two.both(), folder, {{"step", kSavedAt}});
  }
  barrier();
}

TEST(CheckpointTwoOptimizers, MuonAndAdamWSavedAtOneWorldSizeResumeAtAnotherAsIfUninterrupted) {
  const int world = dist().world_size();
  if (world < 2) GTEST_SKIP() << "one rank: no other world size to resume at";
  auto reference = fsdp::fully_shard(fresh_net(), *dist().world);
  auto reference_two = two_optimizers(reference->named_parameters(), /*as_saved=*/true);
  train([&](const torch::Tensor& x) { return reference(x); }, reference_two.both(), 0, kSteps);
  const auto expected_params = fsdp::gather_full_params(reference);
  const auto expected_state = fsdp::gather_full_optimizer_state(reference, reference_two.both());

  const std::string folder = shared_folder("two-optimizers", "resume");
  save_muon_and_adamw(folder, world - 1);
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto two = two_optimizers(model->named_parameters(), /*as_saved=*/false);
  EXPECT_EQ(fsdp::load_sharded(model, two.both(), folder).at("step").get<int>(), kSavedAt);

  // Every option as the saved run had it: the decayed lr included.
  const auto& muon = static_cast<const fsdp::optim::MuonOptions&>(two.muon->param_groups()[0].options());
  const auto saved = saved_muon_options();
  EXPECT_DOUBLE_EQ(muon.lr(), saved.lr() * 0.5);
  EXPECT_EQ(muon.weight_decay(), saved.weight_decay());
  EXPECT_EQ(muon.momentum(), saved.momentum());
  EXPECT_EQ(muon.nesterov(), saved.nesterov());
  EXPECT_EQ(muon.ns_coefficients(), saved.ns_coefficients());
  EXPECT_EQ(muon.eps(), saved.eps());
  EXPECT_EQ(muon.ns_steps(), saved.ns_steps());
  EXPECT_EQ(muon.adjust_lr_fn(), saved.adjust_lr_fn());
  EXPECT_DOUBLE_EQ(two.adamw->param_groups()[0].options().get_lr(), 0.01 * 0.5);

  train([&](const torch::Tensor& x) { return model(x); }, two.both(), kSavedAt, kSteps);
  const double params = worst_relative(fsdp::gather_full_params(model), expected_params, "parameters and buffers");
  const double state = worst_relative(fsdp::gather_full_optimizer_state(model, two.both()), expected_state,
                                      "Muon's and AdamW's state");
  if (dist().rank() == 0) {
    std::printf("[Muon+AdamW] saved at W=%d, resumed at W=%d: max relative difference %.3g (parameters), "
                "%.3g (optimizer state)\n", world - 1, world, params, state);
  }
  remove_shared(folder);
}

// metadata.json: each parameter names the optimizer that held it and lists exactly that
// optimizer's kinds (Muon: momentum_buffer, no step; AdamW: exp_avg, exp_avg_sq and a step);
// both optimizers' param groups, each with its class.
TEST(CheckpointTwoOptimizers, EachParameterRecordsItsOptimizerAndExactlyItsState) {
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto two = two_optimizers(model->named_parameters(), /*as_saved=*/true);
  train([&](const torch::Tensor& x) { return model(x); }, two.both(), 0, 1);
  const std::string folder = shared_folder("two-optimizers", "kinds");
  fsdp::save_sharded(model, two.both(), folder);
  nlohmann::json meta;
  std::ifstream(folder + "/metadata.json") >> meta;
  EXPECT_EQ(meta.at("optimizers"), nlohmann::json({"Muon", "AdamW"}));
  for (const auto& param : meta.at("params")) {
    const std::string name = param.at("name").get<std::string>();
    const bool matrix = kMatrices.count(name) > 0;
    EXPECT_EQ(param.at("optimizer").get<std::string>(), matrix ? "Muon" : "AdamW") << name;
    const std::set<std::string> kinds = matrix ? std::set<std::string>{"momentum_buffer"}
                                               : std::set<std::string>{"exp_avg", "exp_avg_sq"};
    EXPECT_EQ(param.at("optimizer_moments").get<std::set<std::string>>(), kinds) << name;
    EXPECT_EQ(param.at("optimizer_step").is_null(), matrix) << name;
  }
  const auto& groups = meta.at("param_groups");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].at("optimizer"), "Muon");
  EXPECT_EQ(groups[0].at("ns_steps"), 4);
  EXPECT_EQ(groups[1].at("optimizer"), "AdamW");
  EXPECT_EQ(groups[1].at("params").get<std::set<std::string>>(),
            (std::set<std::string>{"block.bn.weight", "block.bn.bias", "head.bias"}));
  remove_shared(folder);
}

// The message of the load that must fail; "" when it succeeded.
std::string load_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

void expect_names(const std::string& text, const std::vector<std::string>& needles) {
  EXPECT_FALSE(text.empty()) << "loaded";
  for (const auto& needle : needles) EXPECT_NE(text.find(needle), std::string::npos) << needle << " in: " << text;
}

// The refusal names a parameter, one of Muon's matrices.
void expect_names_a_matrix(const std::string& text) {
  const std::string lead = "parameter '";
  const auto begin = text.find(lead);
  ASSERT_NE(begin, std::string::npos) << "no parameter named in: " << text;
  const auto end = text.find('\'', begin + lead.size());
  EXPECT_EQ(kMatrices.count(text.substr(begin + lead.size(), end - begin - lead.size())), 1u) << text;
}

TEST(CheckpointTwoOptimizers, MuonStateLoadedIntoAnAdamWIsRefusedByName) {
  const std::string folder = shared_folder("two-optimizers", "muon-into-adamw");
  save_muon_and_adamw(folder, dist().world_size());
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  fsdp::optim::AdamW adamw(model->parameters(), o::AdamWOptions(0.01));
  const std::string text = load_error([&] { fsdp::load_sharded(model, adamw, folder); });
  expect_names(text, {"holds Muon state", "is an AdamW", "reset the optimizer state"});
  expect_names_a_matrix(text);
  remove_shared(folder);
}

TEST(CheckpointTwoOptimizers, AdamWStateLoadedIntoMuonIsRefusedByName) {
  const std::string folder = shared_folder("two-optimizers", "adamw-into-muon");
  {
    auto model = fsdp::fully_shard(fresh_net(), *dist().world);
    fsdp::optim::AdamW adamw(model->parameters(), o::AdamWOptions(0.01));
    train([&](const torch::Tensor& x) { return model(x); }, {&adamw}, 0, 1);
    fsdp::save_sharded(model, adamw, folder);
  }
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto two = two_optimizers(model->named_parameters(), /*as_saved=*/true);
  const std::string text = load_error([&] { fsdp::load_sharded(model, two.both(), folder); });
  expect_names(text, {"holds AdamW state", "is a Muon", "reset the optimizer state"});
  expect_names_a_matrix(text);
  remove_shared(folder);
}

// Muon's options edited in metadata.json out of their range: refused at the load, naming the option
// and the file, not at the first step.
TEST(CheckpointTwoOptimizers, MuonOptionsEditedOutOfRangeAreRefusedAtTheLoad) {
  const std::string folder = shared_folder("two-optimizers", "edited-ns-steps");
  save_muon_and_adamw(folder, dist().world_size());
  if (dist().rank() == 0) {
    nlohmann::json meta;
    std::ifstream(folder + "/metadata.json") >> meta;
    meta.at("param_groups")[0]["ns_steps"] = 1000;
    std::ofstream(folder + "/metadata.json") << meta.dump();
  }
  barrier();
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto two = two_optimizers(model->named_parameters(), /*as_saved=*/true);
  const std::string text = load_error([&] { fsdp::load_sharded(model, two.both(), folder); });
  expect_names(text, {"metadata.json", "ns_steps must be in [0, 100), got 1000", "the file was edited"});
  remove_shared(folder);
}

// Both in the right classes, but in the other order: the param groups would go astray.
TEST(CheckpointTwoOptimizers, OptimizersPassedInAnotherOrderAreRefused) {
  const std::string folder = shared_folder("two-optimizers", "order");
  save_muon_and_adamw(folder, dist().world_size());
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto two = two_optimizers(model->named_parameters(), /*as_saved=*/true);
  const std::string text = load_error([&] { fsdp::load_sharded(model, {two.adamw.get(), two.muon.get()}, folder); });
  expect_names(text, {"saved by the optimizers Muon, AdamW", "the program passes AdamW, Muon", "in its order"});
  remove_shared(folder);
}

TEST(CheckpointTwoOptimizers, AParameterInBothOptimizersIsRefusedByName) {
  auto model = fsdp::fully_shard(fresh_net(), *dist().world);
  auto two = two_optimizers(model->named_parameters(), /*as_saved=*/true);
  fsdp::optim::AdamW everything(model->parameters(), o::AdamWOptions(0.01));
  const std::string folder = shared_folder("two-optimizers", "both");
  const std::string text = load_error([&] { fsdp::save_sharded(model, {two.muon.get(), &everything}, folder); });
  expect_names(text, {"parameter 'block.fc.weight' is in optimizer 0 (a Muon) and in optimizer 1 (an AdamW)",
                      "stepped by one optimizer"});
  EXPECT_FALSE(fs::exists(folder)) << "nothing written";
  barrier();
}

}  // namespace
}  // namespace fsdp_test
