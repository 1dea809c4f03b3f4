// Pipeline parallelism on a model of a user's shape (an embedding, blocks in a ModuleList, a norm,
// a head; called through ->forward), split unevenly into one stage per rank (pp = W), trained 6
// steps with AdamW by 1F1B and by GPipe, against the unsplit model trained on the same global
// batch in this process (plain LibTorch): losses and parameters, by the model's own names.
#include "dist_env.h"
#include "error_of.h"
#include "pipeline_model.h"

#include <fsdp/comm_stats.h>
#include <fsdp/pipeline.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp_test {

namespace {

constexpr int64_t kPpBatch = 8, kPpTokens = 6;

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


// GPT-2's tie: the head's weight is the embedding's tensor, registered under both names (as
// Python's `head.weight = wte.weight`), so the first and the last stage each hold it.
struct PpTiedHeadImpl : torch::nn::Module {
  explicit PpTiedHeadImpl(torch::Tensor shared) { weight = register_parameter("weight", std::move(shared)); }
  torch::Tensor forward(torch::Tensor x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(PpTiedHead);

// A head tied in forward only: it calls the embedding's weight without registering it.
struct PpBorrowingHeadImpl : torch::nn::Module {
  explicit PpBorrowingHeadImpl(torch::nn::Embedding wte) : wte_(std::move(wte)) {}
  torch::Tensor forward(torch::Tensor x) { return torch::nn::functional::linear(x, wte_->weight); }
  torch::nn::Embedding wte_;
};
TORCH_MODULE(PpBorrowingHead);

template <typename Head>
struct PpTiedNetImpl : torch::nn::Module {
  PpTiedNetImpl() {
    wte = register_module("wte", torch::nn::Embedding(kPpVocab, kPpDim));
    h = register_module("h", torch::nn::ModuleList());
    for (int i = 0; i < kPpBlocks; ++i) {
      blocks.push_back(PpBlock());
      h->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kPpDim})));
    if constexpr (std::is_same_v<Head, PpTiedHead>) {
      head = register_module("head", Head(wte->weight));
    } else {
      head = register_module("head", Head(wte));
    }
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
  Head head{nullptr};
};
using PpTiedNet = std::shared_ptr<PpTiedNetImpl<PpTiedHead>>;
using PpBorrowingNet = std::shared_ptr<PpTiedNetImpl<PpBorrowingHead>>;

template <typename Net>
Net seeded_tied_net() {
  torch::manual_seed(0);
  return std::make_shared<typename Net::element_type>();
}

template <typename Net>
std::vector<fsdp::pp::Part> tied_parts_of(Net& net) {
  std::vector<fsdp::pp::Part> parts{{"wte", torch::nn::AnyModule(net->wte)}};
  for (int i = 0; i < kPpBlocks; ++i) {
    parts.push_back({"h." + std::to_string(i), torch::nn::AnyModule(net->blocks[static_cast<size_t>(i)])});
  }
  parts.push_back({"ln_f", torch::nn::AnyModule(net->ln_f)});
  parts.push_back({"head", torch::nn::AnyModule(net->head)});
  return parts;
}

// Two stages per rank at pp = 1, 2, 3, uneven: the embedding (and the tie) in the first, the head
// (and the tie) in the last.
std::vector<std::vector<std::string>> two_per_rank_split(int stages) {
  if (stages == 2) return {{"wte", "h.0"}, {"h.1", "h.2", "h.3", "ln_f", "head"}};
  if (stages == 4) return {{"wte", "h.0"}, {"h.1"}, {"h.2"}, {"h.3", "ln_f", "head"}};
  return {{"wte"}, {"h.0"}, {"h.1"}, {"h.2"}, {"h.3"}, {"ln_f", "head"}};
}

// The pp rank of each stage, written out: loop (s % P) or V (r holds r and 2P-1-r).
int rank_holding(int stage, int pp, fsdp::pp::Schedule schedule) {
  if (schedule != fsdp::pp::Schedule::ZBV) return stage % pp;
  return stage < pp ? stage : 2 * pp - 1 - stage;
}

// Each tensor of a model once (LibTorch lists a tied tensor under both names).
std::vector<torch::Tensor> each_tensor_once(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

template <typename Net>
std::vector<fsdp::pp::Stage> stages_here(Net& net, int pp, int rank, fsdp::pp::Schedule schedule) {
  std::vector<fsdp::pp::Stage> stages;
  for (int s = 0; s < 2 * pp; ++s) {
    if (rank_holding(s, pp, schedule) == rank) {
      stages.emplace_back(*net, tied_parts_of(net), two_per_rank_split(2 * pp), s);
    }
  }
  return stages;
}

// Two stages per rank with GPT-2's tie, 6 AdamW steps against the unsplit tied model: losses and
// parameters within 1e-5, and the tie's two copies (first and last stage) bitwise equal.
void expect_two_stages_per_rank_equal_unsplit(fsdp::pp::Schedule schedule, int microbatches) {
  const int world = fsdp_test::dist().world_size();
  if (world > 3) GTEST_SKIP() << "the splits cover pp = 1, 2, 3";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  const int rank = mesh.coordinate("pp");
  PpTiedNet net = seeded_tied_net<PpTiedNet>();
  fsdp::pp::Pipeline pipe(stages_here(net, world, rank, schedule), mesh.group_ptr("pp"), summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(schedule).microbatches(microbatches));
  torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(1e-2));

  PpTiedNet reference = seeded_tied_net<PpTiedNet>();
  torch::optim::AdamW reference_optim(each_tensor_once(*reference), torch::optim::AdamWOptions(1e-2));
  double max_loss_difference = 0, max_param_difference = 0;
  for (int step = 0; step < 6; ++step) {
    const PpBatch b = batch_of_step(step);
    optim.zero_grad();
    const double loss = pipe.step(b.ids, b.targets);
    optim.step();
    reference_optim.zero_grad();
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
        reference->forward(b.ids).reshape({-1, kPpVocab}), b.targets.reshape({-1}));
    reference_loss.backward();
    reference_optim.step();
    EXPECT_NEAR(loss, reference_loss.item<double>(), 1e-5) << "step " << step;
    max_loss_difference = std::max(max_loss_difference, std::abs(loss - reference_loss.item<double>()));
  }
  auto whole = reference->named_parameters();
  for (auto& stage : pipe.stages()) {
    for (const auto& item : stage.named_parameters()) {
      const double difference = (item.value() - whole[item.key()]).abs().max().item<double>();
      EXPECT_LE(difference, 1e-5) << item.key();
      max_param_difference = std::max(max_param_difference, difference);
    }
  }
  // The first stage's copy of the tie against the last stage's, on its own rank.
  torch::Tensor first_copy = net->wte->weight.detach().clone();
  fsdp::broadcast(*mesh.group_ptr("pp"), first_copy, rank_holding(0, world, schedule));
  if (rank == rank_holding(2 * world - 1, world, schedule)) {
    EXPECT_TRUE(torch::equal(first_copy, net->head->weight)) << "the tie's copies drifted apart";
  }
  std::printf("pipeline %s pp=%d V=2 M=%d rank %d (tied): losses within %.3g, parameters within %.3g\n",
              fsdp::pp::to_string(schedule).c_str(), world, microbatches, rank, max_loss_difference,
              max_param_difference);
}

// Bytes each rank sends in one step: per micro-batch, an activation across each boundary whose
// next stage is on another rank, its gradient back the same (each message with its 80-byte header),
// and the tie's gradient once to the other rank holding it.
void expect_sent_bytes_are_the_formula(fsdp::pp::Schedule schedule, int microbatches) {
  const int world = fsdp_test::dist().world_size();
  if (world > 3) GTEST_SKIP() << "the splits cover pp = 1, 2, 3";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  const int rank = mesh.coordinate("pp"), stages = 2 * world;
  PpTiedNet net = seeded_tied_net<PpTiedNet>();
  fsdp::pp::Pipeline pipe(stages_here(net, world, rank, schedule), mesh.group_ptr("pp"), summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(schedule).microbatches(microbatches));
  const PpBatch b = batch_of_step(0);
  fsdp::reset_comm_stats();
  pipe.step(b.ids, b.targets);
  const int64_t message = 80 + (kPpBatch / microbatches) * kPpTokens * kPpDim * 4;
  int64_t expected = 0;
  for (int s = 0; s < stages; ++s) {
    if (rank_holding(s, world, schedule) != rank) continue;
    if (s + 1 < stages && rank_holding(s + 1, world, schedule) != rank) expected += microbatches * message;
    if (s > 0 && rank_holding(s - 1, world, schedule) != rank) expected += microbatches * message;
  }
  const int first = rank_holding(0, world, schedule), last = rank_holding(stages - 1, world, schedule);
  if (first != last && (rank == first || rank == last)) expected += kPpVocab * kPpDim * 4;
  EXPECT_EQ(fsdp::comm_stats().pp_send_bytes, expected);
  std::printf("pipeline %s pp=%d M=%d rank %d: %lld bytes sent point-to-point (formula %lld)\n",
              fsdp::pp::to_string(schedule).c_str(), world, microbatches, rank,
              static_cast<long long>(fsdp::comm_stats().pp_send_bytes), static_cast<long long>(expected));
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

namespace fsdp_test {

TEST(Pipeline, InterleavedOneFOneBWithATiedWeightEqualsTheUnsplitModel) {
  expect_two_stages_per_rank_equal_unsplit(fsdp::pp::Schedule::Interleaved1F1B, 4);
}

TEST(Pipeline, InterleavedOneFOneBWithFewerMicroBatchesThanRanksRuns) {
  expect_two_stages_per_rank_equal_unsplit(fsdp::pp::Schedule::Interleaved1F1B, 1);
}

TEST(Pipeline, ZbvWithATiedWeightEqualsTheUnsplitModel) {
  expect_two_stages_per_rank_equal_unsplit(fsdp::pp::Schedule::ZBV, 4);
}

TEST(Pipeline, SentBytesAreActivationsGradientsAndTheTie) {
  expect_sent_bytes_are_the_formula(fsdp::pp::Schedule::Interleaved1F1B, 4);
  expect_sent_bytes_are_the_formula(fsdp::pp::Schedule::ZBV, 2);
}

TEST(Pipeline, TheTieIsFoundFromTheModel) {
  PpTiedNet net = seeded_tied_net<PpTiedNet>();
  fsdp::pp::Stage first(*net, tied_parts_of(net), two_per_rank_split(4), 0);
  ASSERT_EQ(first.tied_parameters().size(), 1u);
  EXPECT_EQ(first.tied_parameters()[0].name, "wte.weight");
  EXPECT_EQ(first.tied_parameters()[0].names, (std::vector<std::string>{"wte.weight", "head.weight"}));
  EXPECT_EQ(first.tied_parameters()[0].stages, (std::vector<int>{0, 3}));
  fsdp::pp::Stage middle(*net, tied_parts_of(net), two_per_rank_split(4), 1);
  EXPECT_TRUE(middle.tied_parameters().empty());
  // Inside one stage a tie is one tensor, given to the optimizer once.
  fsdp::pp::Stage whole(*net, tied_parts_of(net), {{"wte", "h", "ln_f", "head"}}, 0);
  EXPECT_TRUE(whole.tied_parameters().empty());
  EXPECT_EQ(whole.parameters().size(), each_tensor_once(*net).size());
}

// The head uses the embedding's weight without registering it: the last stage's rank would train
// a copy nobody holds. Every rank gets the error (W = 2, 3; at W = 1 one rank holds everything).
TEST(Pipeline, AWeightUsedByAStageThatDoesNotHoldItIsRefusedByName) {
  const int world = fsdp_test::dist().world_size();
  if (world == 1 || world > 3) GTEST_SKIP() << "needs the embedding and the head on two ranks";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  const int rank = mesh.coordinate("pp");
  PpBorrowingNet net = seeded_tied_net<PpBorrowingNet>();
  fsdp::pp::Pipeline pipe(stages_here(net, world, rank, fsdp::pp::Schedule::Interleaved1F1B), mesh.group_ptr("pp"),
                          summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(fsdp::pp::Schedule::Interleaved1F1B).microbatches(2));
  const PpBatch b = batch_of_step(0);
  const std::string error = error_of([&] { pipe.step(b.ids, b.targets); });
  if (rank == world - 1) {
    EXPECT_NE(error.find("parameter 'wte.weight' got a gradient on the pp rank of stage(s)"), std::string::npos)
        << error;
    EXPECT_NE(error.find("register_parameter(\"weight\", wte->weight)"), std::string::npos) << error;
  } else {
    EXPECT_NE(error.find("pp rank " + std::to_string(world - 1) + " found a weight"), std::string::npos) << error;
  }
}

// Each rank built its model from its own seed: the tie's copies are made the first stage's at
// construction (the other parameters are each one stage's and stay as built).
TEST(Pipeline, TheTiesCopiesAreMadeEqualAtConstruction) {
  const int world = fsdp_test::dist().world_size();
  if (world == 1 || world > 3) GTEST_SKIP() << "needs the embedding and the head on two ranks";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  const int rank = mesh.coordinate("pp");
  torch::manual_seed(1000 + rank);
  PpTiedNet net = std::make_shared<PpTiedNetImpl<PpTiedHead>>();
  const torch::Tensor built_here = net->wte->weight.detach().clone();
  const auto schedule = fsdp::pp::Schedule::Interleaved1F1B;
  fsdp::pp::Pipeline pipe(stages_here(net, world, rank, schedule), mesh.group_ptr("pp"), summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(schedule).microbatches(2));
  torch::Tensor first_copy = net->wte->weight.detach().clone();
  fsdp::broadcast(*mesh.group_ptr("pp"), first_copy, 0);
  if (rank == rank_holding(2 * world - 1, world, schedule)) {
    EXPECT_FALSE(torch::equal(built_here, first_copy)) << "the ranks' seeds gave one value: nothing is tested";
    EXPECT_TRUE(torch::equal(net->head->weight, first_copy));
  }
  if (rank == 0) {
    EXPECT_TRUE(torch::equal(net->wte->weight, built_here));
  }
}

TEST(Pipeline, StagesTheScheduleDoesNotPutOnThisRankAreRefusedByName) {
  PpTiedNet net = seeded_tied_net<PpTiedNet>();
  auto group = dist().world;
  const int world = dist().world_size();
  if (2 * world > 6) GTEST_SKIP() << "the model has 6 parts: two stages each on at most 3 pp ranks";
  std::vector<fsdp::pp::Stage> wrong;
  wrong.emplace_back(*net, tied_parts_of(net), two_per_rank_split(2 * world), (dist().rank() + 1) % (2 * world));
  std::string error = error_of([&] {
    fsdp::pp::Pipeline(std::move(wrong), group, summed_cross_entropy,
                       fsdp::pp::PipelineOptions().schedule(fsdp::pp::Schedule::Interleaved1F1B).microbatches(2));
  });
  EXPECT_NE(error.find("schedule Interleaved1F1B puts stages"), std::string::npos) << error;
  EXPECT_NE(error.find("fsdp::pp::stages_of_rank"), std::string::npos) << error;
}

namespace {

// The unsplit tied model's mean loss on a batch, and its gradients of that loss by name.
std::pair<double, std::map<std::string, torch::Tensor>> unsplit_loss_and_grads(const PpBatch& b) {
  PpTiedNet reference = seeded_tied_net<PpTiedNet>();
  torch::Tensor loss = torch::nn::functional::cross_entropy(reference->forward(b.ids).reshape({-1, kPpVocab}),
                                                            b.targets.reshape({-1}));
  loss.backward();
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : reference->named_parameters()) grads[item.key()] = item.value().grad();
  return {loss.item<double>(), grads};
}

}  // namespace

// Pipeline::evaluate under ZBV (V placement: stage 2P-1 waits on rank 0 for another rank's stage)
// and interleaved 1F1B, with GPT-2's tie: the unsplit model's mean loss, on every rank, and no
// gradient anywhere.
TEST(Pipeline, EvaluateIsTheUnsplitModelsLossWithoutGradients) {
  const int world = fsdp_test::dist().world_size();
  if (world > 3) GTEST_SKIP() << "the splits cover pp = 1, 2, 3";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  const PpBatch b = batch_of_step(0);
  const double expected = unsplit_loss_and_grads(b).first;
  for (auto schedule : {fsdp::pp::Schedule::ZBV, fsdp::pp::Schedule::Interleaved1F1B}) {
    PpTiedNet net = seeded_tied_net<PpTiedNet>();
    fsdp::pp::Pipeline pipe(stages_here(net, world, mesh.coordinate("pp"), schedule), mesh.group_ptr("pp"),
                            summed_cross_entropy, fsdp::pp::PipelineOptions().schedule(schedule).microbatches(4));
    for (int microbatches : {0, 1, 2}) {
      const double loss = pipe.evaluate(b.ids, b.targets, microbatches);
      EXPECT_NEAR(loss, expected, 1e-5) << fsdp::pp::to_string(schedule) << " micro-batches " << microbatches;
    }
    for (const torch::Tensor& p : pipe.parameters()) EXPECT_FALSE(p.grad().defined());
  }
}

// Gradient accumulation over whole schedules: two steps of half the batch each, normalized by the
// whole batch's tokens and not zeroed between, hold the unsplit model's gradient of the whole
// batch's mean (the tie's too: each step's sum over its holders added once), and their losses add
// up to its mean.
TEST(Pipeline, StepsAccumulatedOverTheirTokensEqualOneStepOfTheWholeBatch) {
  const int world = fsdp_test::dist().world_size();
  if (world > 3) GTEST_SKIP() << "the splits cover pp = 1, 2, 3";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", world}, {"dp", 1}});
  const auto schedule = fsdp::pp::Schedule::Interleaved1F1B;
  PpTiedNet net = seeded_tied_net<PpTiedNet>();
  fsdp::pp::Pipeline pipe(stages_here(net, world, mesh.coordinate("pp"), schedule), mesh.group_ptr("pp"),
                          summed_cross_entropy, fsdp::pp::PipelineOptions().schedule(schedule).microbatches(2));
  const PpBatch b = batch_of_step(0);
  const auto [expected_loss, expected_grads] = unsplit_loss_and_grads(b);
  double loss = 0;
  for (int half = 0; half < 2; ++half) {
    loss += pipe.step(b.ids.chunk(2)[half], b.targets.chunk(2)[half], b.targets.numel());
  }
  EXPECT_NEAR(loss, expected_loss, 1e-5);
  for (const fsdp::pp::Stage& stage : pipe.stages()) {
    for (const auto& item : stage.named_parameters()) {
      const double off = (item.value().grad() - expected_grads.at(item.key())).abs().max().item<double>();
      EXPECT_LE(off, 1e-6) << item.key() << " on stage " << stage.index();
    }
  }
}

}  // namespace fsdp_test
