// Pipeline parallelism on a model of a user's shape (an embedding, blocks in a ModuleList, a norm,
// a head; called through ->forward), split unevenly into one stage per rank (pp = W), trained 6
// steps with AdamW by 1F1B and by GPipe, against the unsplit model trained on the same global
// batch in this process (plain LibTorch): losses and parameters, by the model's own names.
#include "dist_env.h"
#include "error_of.h"

#include <fsdp/pipeline.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace fsdp_test {

namespace {

constexpr int64_t kPpVocab = 32, kPpDim = 16, kPpBlocks = 4, kPpBatch = 8, kPpTokens = 6;

struct PpBlockImpl : torch::nn::Module {
  PpBlockImpl() {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kPpDim})));
    fc1 = register_module("fc1", torch::nn::Linear(kPpDim, 2 * kPpDim));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kPpDim, kPpDim));
  }
  torch::Tensor forward(torch::Tensor x) { return x + fc2->forward(torch::gelu(fc1->forward(ln->forward(x)))); }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(PpBlock);

struct PpNetImpl : torch::nn::Module {
  PpNetImpl() {
    wte = register_module("wte", torch::nn::Embedding(kPpVocab, kPpDim));
    h = register_module("h", torch::nn::ModuleList());
    for (int i = 0; i < kPpBlocks; ++i) {
      blocks.push_back(PpBlock());
      h->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kPpDim})));
    head = register_module("head", torch::nn::Linear(kPpDim, kPpVocab));
  }
  torch::Tensor forward(torch::Tensor ids) {
    torch::Tensor x = wte->forward(ids);
    for (auto& block : blocks) x = block->forward(x);
    return head->forward(ln_f->forward(x));
  }
  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<PpBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(PpNet);

PpNet seeded_pp_net() {
  torch::manual_seed(0);  // LibTorch seeds each process at random: the same model on every rank
  return PpNet();
}

// The model's forward, as a chain of its own modules.
std::vector<fsdp::pp::Part> parts_of(PpNet& net) {
  std::vector<fsdp::pp::Part> parts{{"wte", torch::nn::AnyModule(net->wte)}};
  for (int i = 0; i < kPpBlocks; ++i) {
    parts.push_back({"h." + std::to_string(i), torch::nn::AnyModule(net->blocks[static_cast<size_t>(i)])});
  }
  parts.push_back({"ln_f", torch::nn::AnyModule(net->ln_f)});
  parts.push_back({"head", torch::nn::AnyModule(net->head)});
  return parts;
}

// Uneven splits, the embedding with the first blocks and the norm and head with the last.
std::vector<std::vector<std::string>> split_for(int stages) {
  if (stages == 1) return {{"wte", "h", "ln_f", "head"}};
  if (stages == 2) return {{"wte", "h.0"}, {"h.1", "h.2", "h.3", "ln_f", "head"}};
  return {{"wte", "h.0"}, {"h.1", "h.2"}, {"h.3", "ln_f", "head"}};
}

torch::Tensor summed_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, kPpVocab}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

struct PpBatch {
  torch::Tensor ids, targets;
};
PpBatch batch_of_step(int step) {
  torch::manual_seed(100 + step);
  return {torch::randint(kPpVocab, {kPpBatch, kPpTokens}, torch::kLong), torch::randint(kPpVocab, {kPpBatch, kPpTokens}, torch::kLong)};
}

// Trains the pipelined model and the unsplit one side by side; compares losses and parameters.
void expect_pipeline_equals_unsplit(fsdp::pp::Schedule schedule, int microbatches) {
  const int world = fsdp_test::dist().world_size();
  if (world > 3) GTEST_SKIP() << "the splits cover pp = 1, 2, 3";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  PpNet net = seeded_pp_net();
  fsdp::pp::Stage stage(*net, parts_of(net), split_for(world), mesh.coordinate("pp"));
  fsdp::pp::Pipeline pipe(std::move(stage), mesh.group_ptr("pp"), summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(schedule).microbatches(microbatches));
  torch::optim::AdamW optim(pipe.stage().parameters(), torch::optim::AdamWOptions(1e-2));

  PpNet reference = seeded_pp_net();
  torch::optim::AdamW reference_optim(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  double max_loss_difference = 0, max_param_difference = 0;
  for (int step = 0; step < 6; ++step) {
    const PpBatch b = batch_of_step(step);
    optim.zero_grad();
    const double loss = pipe.step(b.ids, b.targets);
    optim.step();
    reference_optim.zero_grad();
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(reference->forward(b.ids).reshape({-1, kPpVocab}),
                                                                        b.targets.reshape({-1}));
    reference_loss.backward();
    reference_optim.step();
    EXPECT_NEAR(loss, reference_loss.item<double>(), 1e-5) << "step " << step;
    max_loss_difference = std::max(max_loss_difference, std::abs(loss - reference_loss.item<double>()));
  }
  auto whole = reference->named_parameters();
  ASSERT_FALSE(pipe.stage().named_parameters().is_empty());
  for (const auto& item : pipe.stage().named_parameters()) {
    ASSERT_TRUE(whole.contains(item.key())) << item.key() << " is not a name of the unsplit model";
    const double difference = (item.value() - whole[item.key()]).abs().max().item<double>();
    EXPECT_LE(difference, 1e-5) << item.key();
    max_param_difference = std::max(max_param_difference, difference);
  }
  std::printf("pipeline %s pp=%d M=%d stage %d: losses within %.3g, parameters within %.3g\n",
              fsdp::pp::to_string(schedule).c_str(), world, microbatches, mesh.coordinate("pp"), max_loss_difference,
              max_param_difference);
}

}  // namespace

TEST(Pipeline, OneFOneBEqualsTheUnsplitModel) { expect_pipeline_equals_unsplit(fsdp::pp::Schedule::OneFOneB, 4); }

TEST(Pipeline, GPipeEqualsTheUnsplitModel) { expect_pipeline_equals_unsplit(fsdp::pp::Schedule::GPipe, 4); }

TEST(Pipeline, GPipeWithFewerMicroBatchesThanStagesRuns) {
  expect_pipeline_equals_unsplit(fsdp::pp::Schedule::GPipe, 1);
}

TEST(Pipeline, StagesKeepTheModelsOwnNames) {
  PpNet net = seeded_pp_net();
  fsdp::pp::Stage last(*net, parts_of(net), split_for(2), 1);
  EXPECT_EQ(last.part_names(), (std::vector<std::string>{"h.1", "h.2", "h.3", "ln_f", "head"}));
  EXPECT_TRUE(last.named_parameters().contains("h.3.fc1.weight"));
  EXPECT_TRUE(last.named_parameters().contains("head.bias"));
  EXPECT_FALSE(last.named_parameters().contains("wte.weight"));
}

TEST(Pipeline, WrongSplitsAreRefusedByName) {
  PpNet net = seeded_pp_net();
  auto error = error_of([&] { fsdp::pp::Stage(*net, parts_of(net), {{"wte", "h.0"}, {"h.9", "ln_f", "head"}}, 0); });
  EXPECT_NE(error.find("'h.9' is no part of the forward chain"), std::string::npos) << error;
  error = error_of([&] { fsdp::pp::Stage(*net, parts_of(net), {{"wte", "h.0", "h.2"}, {"h.1", "h.3", "ln_f", "head"}}, 0); });
  EXPECT_NE(error.find("stages must take the forward chain in order"), std::string::npos) << error;
  error = error_of([&] { fsdp::pp::Stage(*net, parts_of(net), {{"wte", "h.0"}, {"ln_f", "head"}}, 0); });
  EXPECT_NE(error.find("part 'h.1' is in no stage"), std::string::npos) << error;
  PpNet other = seeded_pp_net();
  auto parts = parts_of(net);
  parts[0].module = torch::nn::AnyModule(other->wte);
  error = error_of([&] { fsdp::pp::Stage(*net, parts, split_for(1), 0); });
  EXPECT_NE(error.find("not the model's module of that name"), std::string::npos) << error;
}

}  // namespace fsdp_test
