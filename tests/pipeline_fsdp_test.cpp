// FSDP inside each pipeline stage (the FSDP paper's section 7.1.1) on a 2 x 2 mesh (pp outermost:
// stage s on the dp pair with pp coordinate s, sharded over it): a model of a user's shape split
// unevenly, trained 6 AdamW steps by 1F1B and GPipe under each strategy, against the unsplit
// model trained on the same global batch in this process (plain LibTorch, no library code):
// losses and the gathered parameters, by the model's own names. The bytes each step moves are
// counted by fsdp's comm stats and checked against the stage's parameter count: one all-gather
// and one reduce-scatter a step, not one per micro-batch; M all-gathers when resharding after
// each micro-batch. ZBV (its W adds into the held sum) and GPT-2's tie across sharded stages
// (with clipping, and in bf16) against the same reference. What does not compose is refused by
// name.
#include "dist_env.h"
#include "error_of.h"
#include "pipeline_model.h"

#include <fsdp/comm_stats.h>
#include <fsdp/fully_shard.h>
#include <fsdp/pipeline.h>
#include <fsdp/state_dict.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp_test {
// Named, not anonymous: the unity build compiles this file with pipeline_test.cpp's helpers.
namespace pipeline_fsdp {

constexpr int64_t kVocab = kPpVocab, kBlocks = kPpBlocks, kGlobalBatch = 16, kTokens = 6;
constexpr int kPp = 2, kDp = 2, kMicrobatches = 4, kSteps = 6;
constexpr double kLr = 1e-2;

using StagedNet = PpNet;
StagedNet seeded_net() { return seeded_pp_net(); }  // the same model on every rank and in the reference

// Uneven: one block with the embedding, three with the norm and the head.
const std::vector<std::vector<std::string>> kSplit{{"wte", "h.0"}, {"h.1", "h.2", "h.3", "ln_f", "head"}};

// In fp32 also under mixed precision (a bf16 sum of a micro-batch's losses keeps 3 digits).
torch::Tensor summed_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat).reshape({-1, kVocab}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

struct GlobalBatch {
  torch::Tensor ids, targets;
};
GlobalBatch global_batch(int step) {
  torch::manual_seed(200 + step);
  return {torch::randint(kVocab, {kGlobalBatch, kTokens}, torch::kLong),
          torch::randint(kVocab, {kGlobalBatch, kTokens}, torch::kLong)};
}
// This dp rank's equal share of the global batch's rows.
torch::Tensor share_of(const torch::Tensor& global, int dp_rank) {
  return global.chunk(kDp, 0)[static_cast<size_t>(dp_rank)];
}

struct Config {
  fsdp::pp::Schedule schedule = fsdp::pp::Schedule::OneFOneB;
  fsdp::FullyShardOptions fsdp;
  bool reshard_after_microbatch = false;
};

std::string describe(const Config& c) {
  return fsdp::pp::to_string(c.schedule) + " " + fsdp::to_string(c.fsdp.strategy()) +
         (c.reshard_after_microbatch ? " reshard_after_microbatch" : "");
}

// One rank's pipeline: its stage of its own copy of the model, sharded over its dp group.
struct ShardedPipeline {
  explicit ShardedPipeline(const Config& c)
      : mesh(dist().world, {{"pp", kPp}, {"dp", kDp}}), net(seeded_net()) {
    fsdp::pp::Stage stage(*net, parts_of(net), kSplit, mesh.coordinate("pp"));
    stage.fully_shard(mesh.group("dp"), c.fsdp);
    pipe = std::make_unique<fsdp::pp::Pipeline>(
        std::move(stage), mesh.group_ptr("pp"), summed_cross_entropy,
        fsdp::pp::PipelineOptions().schedule(c.schedule).microbatches(kMicrobatches).reshard_after_microbatch(
            c.reshard_after_microbatch));
  }
  // The step's loss over the global batch: the mean of the dp ranks' means (equal shares).
  double step(const GlobalBatch& b) {
    const int dp_rank = mesh.coordinate("dp");
    const double local = pipe->step(share_of(b.ids, dp_rank), share_of(b.targets, dp_rank));
    torch::Tensor sum = torch::tensor({local}, torch::kDouble);
    fsdp::all_reduce_sum(mesh.group("dp"), sum);
    return sum.item<double>() / kDp;
  }

  fsdp::DeviceMesh mesh;
  StagedNet net;
  std::unique_ptr<fsdp::pp::Pipeline> pipe;
};

bool skipped_off_world4() { return dist().world_size() != kPp * kDp; }

// Trains the sharded pipeline and the unsplit model side by side; compares losses, then the
// stage's gathered parameters with the reference's of the same names.
struct Tolerance {
  double loss = 1e-5, param = 1e-5;  // fp32
};
void expect_sharded_pipeline_equals_unsplit(const Config& c, Tolerance tolerance = {}) {
  SCOPED_TRACE(describe(c));
  ShardedPipeline run(c);
  torch::optim::AdamW optim(run.pipe->stage().parameters(), torch::optim::AdamWOptions(kLr));
  StagedNet reference = seeded_net();
  torch::optim::AdamW reference_optim(reference->parameters(), torch::optim::AdamWOptions(kLr));
  double max_loss_difference = 0;
  for (int step = 0; step < kSteps; ++step) {
    const GlobalBatch b = global_batch(step);
    optim.zero_grad();
    const double loss = run.step(b);
    optim.step();
    reference_optim.zero_grad();
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
        reference->forward(b.ids).reshape({-1, kVocab}), b.targets.reshape({-1}));
    reference_loss.backward();
    reference_optim.step();
    EXPECT_NEAR(loss, reference_loss.item<double>(), tolerance.loss) << "step " << step;
    max_loss_difference = std::max(max_loss_difference, std::abs(loss - reference_loss.item<double>()));
  }
  const auto whole = reference->named_parameters();
  const auto gathered = fsdp::gather_full_params(run.pipe->stage().sharded_model());
  ASSERT_EQ(gathered.size(), run.pipe->stage().named_parameters().size());
  double max_param_difference = 0;
  for (const auto& [name, value] : gathered) {
    ASSERT_TRUE(run.pipe->stage().named_parameters().contains(name)) << name << " is not a name of the stage";
    ASSERT_TRUE(whole.contains(name)) << name << " is not a name of the unsplit model";
    const double difference = (value - whole[name]).abs().max().item<double>();
    EXPECT_LE(difference, tolerance.param) << name;
    max_param_difference = std::max(max_param_difference, difference);
  }
  std::printf("pipeline+fsdp %s pp=%d dp=%d M=%d stage %d: losses within %.3g, parameters within %.3g\n",
              describe(c).c_str(), kPp, kDp, kMicrobatches, run.mesh.coordinate("pp"), max_loss_difference,
              max_param_difference);
}

// Elements of this rank's stage, from the unsplit model's parameters of the stage's names.
int64_t stage_numel(const fsdp::pp::Stage& stage) {
  StagedNet whole = seeded_net();
  int64_t numel = 0;
  for (const auto& item : whole->named_parameters()) {
    if (stage.named_parameters().contains(item.key())) numel += item.value().numel();
  }
  return numel;
}

struct StepBytes {
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
};
// What the second step of `c` sends (the first warms nothing up that the formula ignores, but a
// steady step is what a run repeats).
StepBytes bytes_of_a_step(const Config& c, int64_t* numel) {
  ShardedPipeline run(c);
  *numel = stage_numel(run.pipe->stage());
  torch::optim::SGD optim(run.pipe->stage().parameters(), torch::optim::SGDOptions(1e-2));
  StepBytes bytes;
  for (int step = 0; step < 2; ++step) {
    const GlobalBatch b = global_batch(step);
    const int dp_rank = run.mesh.coordinate("dp");
    optim.zero_grad();
    const auto before = fsdp::comm_stats();
    run.pipe->step(share_of(b.ids, dp_rank), share_of(b.targets, dp_rank));
    const auto after = fsdp::comm_stats();
    optim.step();
    bytes = {after.all_gather_bytes - before.all_gather_bytes,
             after.reduce_scatter_bytes - before.reduce_scatter_bytes,
             after.all_reduce_bytes - before.all_reduce_bytes};
  }
  return bytes;
}

TEST(PipelineFsdp, OneFOneBEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  expect_sharded_pipeline_equals_unsplit({fsdp::pp::Schedule::OneFOneB, fsdp::FullyShardOptions(), false});
}

TEST(PipelineFsdp, GPipeEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  expect_sharded_pipeline_equals_unsplit({fsdp::pp::Schedule::GPipe, fsdp::FullyShardOptions(), false});
}

TEST(PipelineFsdp, EveryStrategyEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  using fsdp::ShardingStrategy;
  for (const auto& options : {fsdp::FullyShardOptions().strategy(ShardingStrategy::ShardGradOp),
                              fsdp::FullyShardOptions().strategy(ShardingStrategy::NoShard),
                              fsdp::FullyShardOptions().strategy(ShardingStrategy::HybridShard).shard_group_size(1)}) {
    expect_sharded_pipeline_equals_unsplit({fsdp::pp::Schedule::OneFOneB, options, false});
  }
}

TEST(PipelineFsdp, ReshardingAfterEachMicroBatchEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  expect_sharded_pipeline_equals_unsplit({fsdp::pp::Schedule::OneFOneB, fsdp::FullyShardOptions(), true});
  expect_sharded_pipeline_equals_unsplit({fsdp::pp::Schedule::GPipe, fsdp::FullyShardOptions(), true});
}

// bf16 compute and activations between stages, fp32 reductions and master weights, against the
// fp32 reference: the losses (~3.5) within 1e-2 (bf16 keeps 3 digits); a parameter within
// 2 lr a step (an AdamW update is at most ~lr, and a bf16 gradient may flip a tiny one's sign).
TEST(PipelineFsdp, MixedPrecisionTrainsTheUnsplitModelWithinBf16Rounding) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  const auto bf16 = fsdp::MixedPrecision().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat);
  expect_sharded_pipeline_equals_unsplit(
      {fsdp::pp::Schedule::OneFOneB, fsdp::FullyShardOptions().mixed_precision(bf16), false},
      {1e-2, 2 * kLr * kSteps});
}

// The pipeline's own all-reduce each step over pp: the loss and each rank's borrowed-weight flag,
// P + 1 doubles, of which a ring sends 2 (P - 1) / P.
constexpr int64_t kPipelineAllReduce = 2 * (kPp - 1) * 8 * (kPp + 1) / kPp;

// One rank's shard of the stage's flat parameter is ceil(N / D) fp32 elements; the ring sends
// D - 1 shards per all-gather and per reduce-scatter.
TEST(PipelineFsdp, GathersAndReducesOncePerStepNotPerMicroBatch) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  for (const auto schedule : {fsdp::pp::Schedule::OneFOneB, fsdp::pp::Schedule::GPipe}) {
    int64_t numel = 0;
    const StepBytes once = bytes_of_a_step({schedule, fsdp::FullyShardOptions(), false}, &numel);
    const int64_t shard_bytes = 4 * ((numel + kDp - 1) / kDp);
    EXPECT_EQ(once.all_gather, (kDp - 1) * shard_bytes) << fsdp::pp::to_string(schedule);
    EXPECT_EQ(once.reduce_scatter, (kDp - 1) * shard_bytes) << fsdp::pp::to_string(schedule);
    EXPECT_EQ(once.all_reduce, kPipelineAllReduce) << fsdp::pp::to_string(schedule);
    const StepBytes each = bytes_of_a_step({schedule, fsdp::FullyShardOptions(), true}, &numel);
    EXPECT_EQ(each.all_gather, kMicrobatches * (kDp - 1) * shard_bytes) << fsdp::pp::to_string(schedule);
    EXPECT_EQ(each.reduce_scatter, (kDp - 1) * shard_bytes) << fsdp::pp::to_string(schedule);
    std::printf("pipeline+fsdp %s stage of %lld elements: all-gather %lld bytes a step (%lld resharding after "
                "each of %d micro-batches), reduce-scatter %lld\n",
                fsdp::pp::to_string(schedule).c_str(), (long long)numel, (long long)once.all_gather,
                (long long)each.all_gather, kMicrobatches, (long long)once.reduce_scatter);
  }
}

TEST(PipelineFsdp, NoShardAllReducesOncePerStep) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  int64_t numel = 0;
  const StepBytes bytes = bytes_of_a_step(
      {fsdp::pp::Schedule::OneFOneB, fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::NoShard), false},
      &numel);
  EXPECT_EQ(bytes.all_gather, 0);
  EXPECT_EQ(bytes.reduce_scatter, 0);
  // A ring all-reduce of the stage's 4N bytes over D ranks sends 2 (D - 1) / D of them.
  EXPECT_EQ(bytes.all_reduce, 2 * (kDp - 1) * 4 * numel / kDp + kPipelineAllReduce);
}

TEST(PipelineFsdp, WhatDoesNotComposeIsRefusedByName) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", kPp}, {"dp", kDp}});
  StagedNet net = seeded_net();
  fsdp::pp::Stage stage(*net, parts_of(net), kSplit, mesh.coordinate("pp"));
  auto refusal = [&](const fsdp::FullyShardOptions& options) {
    return error_of([&] { stage.fully_shard(mesh.group("dp"), options); });
  };
  std::string error = refusal(fsdp::FullyShardOptions().cpu_offload(true));
  EXPECT_NE(error.find("cpu_offload does not compose"), std::string::npos) << error;
  error = refusal(fsdp::FullyShardOptions().reshard_after_forward(true));
  EXPECT_NE(error.find("use PipelineOptions::reshard_after_microbatch(true)"), std::string::npos) << error;
  {
    fsdp::Unit<PpBlock> unit(net->blocks[static_cast<size_t>(kBlocks - 1)]);  // h.3: the last stage's
    fsdp::Unit<PpBlock> first(net->blocks[0]);                                // h.0: the first stage's
    error = refusal(fsdp::FullyShardOptions());
    EXPECT_NE(error.find("is held by an fsdp::Unit"), std::string::npos) << error;
  }
  error = error_of([&] {
    fsdp::pp::Pipeline(stage, mesh.group_ptr("pp"), summed_cross_entropy,
                       fsdp::pp::PipelineOptions().reshard_after_microbatch(true));
  });
  EXPECT_NE(error.find("reshard_after_microbatch(true) on stage"), std::string::npos) << error;
  EXPECT_NE(error.find("which is not sharded"), std::string::npos) << error;
  stage.fully_shard(mesh.group("dp"));
  error = refusal(fsdp::FullyShardOptions());
  EXPECT_NE(error.find("is sharded already"), std::string::npos) << error;
  error = error_of([&] {
    fsdp::pp::Pipeline(stage, mesh.group_ptr("pp"), summed_cross_entropy, fsdp::pp::PipelineOptions(),
                       std::make_shared<fsdp::pp::StageSharding>());
  });
  EXPECT_NE(error.find("is sharded (Stage::fully_shard) and a StageSharding was given too"), std::string::npos)
      << error;
}

// Interleaved 1F1B with two sharded stages on each pp rank (loop placement: rank 0 runs stages 0
// and 2, rank 1 runs 1 and 3), each stage its own FSDP unit over dp, each gathered and reduced
// once a step (a stage run without its hold still trains exactly, gathering per micro-batch:
// only the bytes show it).
TEST(PipelineFsdp, InterleavedWithTwoShardedStagesPerRankEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  const std::vector<std::vector<std::string>> split{{"wte", "h.0"}, {"h.1"}, {"h.2"}, {"h.3", "ln_f", "head"}};
  fsdp::DeviceMesh mesh(dist().world, {{"pp", kPp}, {"dp", kDp}});
  StagedNet net = seeded_net();
  const auto schedule = fsdp::pp::Schedule::Interleaved1F1B;
  std::vector<fsdp::pp::Stage> stages;
  for (int s : fsdp::pp::stages_of_rank(mesh.coordinate("pp"), kPp, 4, fsdp::pp::placement_of(schedule))) {
    stages.emplace_back(*net, parts_of(net), split, s);
    stages.back().fully_shard(mesh.group("dp"));
  }
  fsdp::pp::Pipeline pipe(std::move(stages), mesh.group_ptr("pp"), summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(schedule).microbatches(kMicrobatches));
  torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(kLr));
  StagedNet reference = seeded_net();
  torch::optim::AdamW reference_optim(reference->parameters(), torch::optim::AdamWOptions(kLr));
  const int dp_rank = mesh.coordinate("dp");
  int64_t once_per_step = 0;  // each local stage gathered once a step, and reduced once
  for (const fsdp::pp::Stage& stage : pipe.stages()) once_per_step += (kDp - 1) * 4 * ((stage_numel(stage) + kDp - 1) / kDp);
  for (int step = 0; step < kSteps; ++step) {
    const GlobalBatch b = global_batch(step);
    optim.zero_grad();
    const auto before = fsdp::comm_stats();
    torch::Tensor loss = torch::tensor({pipe.step(share_of(b.ids, dp_rank), share_of(b.targets, dp_rank))},
                                       torch::kDouble);
    const auto after = fsdp::comm_stats();
    EXPECT_EQ(after.all_gather_bytes - before.all_gather_bytes, once_per_step) << "step " << step;
    EXPECT_EQ(after.reduce_scatter_bytes - before.reduce_scatter_bytes, once_per_step) << "step " << step;
    fsdp::all_reduce_sum(mesh.group("dp"), loss);
    optim.step();
    reference_optim.zero_grad();
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
        reference->forward(b.ids).reshape({-1, kVocab}), b.targets.reshape({-1}));
    reference_loss.backward();
    reference_optim.step();
    EXPECT_NEAR(loss.item<double>() / kDp, reference_loss.item<double>(), 1e-5) << "step " << step;
  }
  const auto whole = reference->named_parameters();
  for (fsdp::pp::Stage& stage : pipe.stages()) {
    for (const auto& [name, value] : fsdp::gather_full_params(stage.sharded_model())) {
      EXPECT_LE((value - whole[name]).abs().max().item<double>(), 1e-5) << name;
    }
  }
}

// A head whose weight is another module's tensor, registered under its own name too.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(torch::Tensor shared) { weight = register_parameter("weight", std::move(shared)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

// The model and its chain of parts; GPT-2's tie when `tied`: the head's weight is the embedding's
// tensor, registered under both names.
struct ChainedNet {
  StagedNet net;
  std::vector<fsdp::pp::Part> parts;
};
ChainedNet chained_net(bool tied) {
  ChainedNet out{seeded_net(), {}};
  out.parts = parts_of(out.net);
  if (tied) {
    TiedHead head(out.net->wte->weight);
    out.net->replace_module("head", head);
    out.parts.back() = {"head", torch::nn::AnyModule(head)};
  }
  return out;
}
// The unsplit forward: the parts in order (the net's own forward calls its untied head).
torch::Tensor forward_through(std::vector<fsdp::pp::Part>& parts, torch::Tensor x) {
  for (fsdp::pp::Part& part : parts) x = part.module.forward(x);
  return x;
}
// Each tensor once (a tied one is the model's under two names).
std::vector<torch::Tensor> distinct(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) {
    if (std::none_of(out.begin(), out.end(), [&](const torch::Tensor& q) { return q.is_same(p); })) out.push_back(p);
  }
  return out;
}

struct StagesConfig {
  fsdp::pp::Schedule schedule = fsdp::pp::Schedule::OneFOneB;
  std::vector<std::vector<std::string>> split = kSplit;
  bool tied = false;
  fsdp::FullyShardOptions fsdp;
  double loss_tolerance = 1e-5, param_tolerance = 1e-5;
  double max_norm = 0;  // > 0: each step clips both to it, and their norms are compared
  bool reshard_after_microbatch = false;
};

// Every stage of this rank sharded over dp, trained by `c.schedule` beside the unsplit model
// (plain LibTorch) on the same global batch: losses, the clipped norms and the gathered
// parameters, by the model's own names (a tie's under each stage's name for it).
void expect_sharded_stages_equal_unsplit(const StagesConfig& c) {
  SCOPED_TRACE(fsdp::pp::to_string(c.schedule) + (c.tied ? " tied" : "") +
               (c.reshard_after_microbatch ? " reshard_after_microbatch" : ""));
  fsdp::DeviceMesh mesh(dist().world, {{"pp", kPp}, {"dp", kDp}});
  ChainedNet model = chained_net(c.tied);
  const int num_stages = static_cast<int>(c.split.size());
  std::vector<fsdp::pp::Stage> stages;
  for (int s : fsdp::pp::stages_of_rank(mesh.coordinate("pp"), kPp, num_stages, fsdp::pp::placement_of(c.schedule))) {
    stages.emplace_back(*model.net, model.parts, c.split, s);
    stages.back().fully_shard(mesh.group("dp"), c.fsdp);
  }
  fsdp::pp::Pipeline pipe(std::move(stages), mesh.group_ptr("pp"), summed_cross_entropy,
                          fsdp::pp::PipelineOptions().schedule(c.schedule).microbatches(kMicrobatches)
                              .reshard_after_microbatch(c.reshard_after_microbatch));
  torch::optim::AdamW optim(pipe.parameters(), torch::optim::AdamWOptions(kLr));
  ChainedNet reference = chained_net(c.tied);
  torch::optim::AdamW reference_optim(distinct(reference.net->parameters()), torch::optim::AdamWOptions(kLr));
  const int dp_rank = mesh.coordinate("dp");
  double max_loss_difference = 0, max_norm_difference = 0;
  for (int step = 0; step < kSteps; ++step) {
    const GlobalBatch b = global_batch(step);
    optim.zero_grad();
    torch::Tensor loss = torch::tensor({pipe.step(share_of(b.ids, dp_rank), share_of(b.targets, dp_rank))},
                                       torch::kDouble);
    fsdp::all_reduce_sum(mesh.group("dp"), loss);
    const double norm = c.max_norm > 0 ? fsdp::pp::clip_grad_norm_(pipe, c.max_norm) : 0;
    optim.step();
    reference_optim.zero_grad();
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
        forward_through(reference.parts, b.ids).reshape({-1, kVocab}), b.targets.reshape({-1}));
    reference_loss.backward();
    const double reference_norm =
        c.max_norm > 0 ? torch::nn::utils::clip_grad_norm_(distinct(reference.net->parameters()), c.max_norm) : 0;
    reference_optim.step();
    const double difference = std::abs(loss.item<double>() / kDp - reference_loss.item<double>());
    EXPECT_LE(difference, c.loss_tolerance) << "step " << step;
    EXPECT_NEAR(norm, reference_norm, 1e-5 * std::max(1.0, reference_norm)) << "step " << step;
    max_loss_difference = std::max(max_loss_difference, difference);
    max_norm_difference = std::max(max_norm_difference, std::abs(norm - reference_norm));
  }
  const auto whole = reference.net->named_parameters();
  double max_param_difference = 0;
  for (fsdp::pp::Stage& stage : pipe.stages()) {
    for (const auto& [name, value] : fsdp::gather_full_params(stage.sharded_model())) {
      const double difference = (value - whole[name]).abs().max().item<double>();
      EXPECT_LE(difference, c.param_tolerance) << name;
      max_param_difference = std::max(max_param_difference, difference);
    }
  }
  std::printf("sharded stages %s%s pp=%d dp=%d M=%d: losses within %.3g, norms within %.3g, parameters within %.3g\n",
              fsdp::pp::to_string(c.schedule).c_str(), c.tied ? " tied" : "", kPp, kDp, kMicrobatches,
              max_loss_difference, max_norm_difference, max_param_difference);
}

const std::vector<std::vector<std::string>> kFourStages{{"wte", "h.0"}, {"h.1"}, {"h.2"}, {"h.3", "ln_f", "head"}};

// ZBV's W adds each micro-batch's weight gradients into the held unsharded sum, reduced once
// after the stage's last W (V placement: rank 0 runs stages 0 and 3, rank 1 runs 1 and 2); also
// resharding after each micro-batch's W and gathering again before its I and W.
TEST(PipelineFsdp, ZbvWithShardedStagesEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  StagesConfig c;
  c.schedule = fsdp::pp::Schedule::ZBV;
  c.split = kFourStages;
  expect_sharded_stages_equal_unsplit(c);
  c.reshard_after_microbatch = true;
  expect_sharded_stages_equal_unsplit(c);
}

// GPT-2's tie over sharded stages ([Note: a tie across sharded stages]): the embedding (stage 0)
// and the head (the last stage) on different pp ranks, each copy's gradient the sum of both
// stages', and the clipped norm counting it once.
TEST(PipelineFsdp, TiedWeightAcrossShardedStagesEqualsTheUnsplitModel) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  StagesConfig c;
  c.tied = true;
  c.max_norm = 0.5;
  expect_sharded_stages_equal_unsplit(c);
  c.schedule = fsdp::pp::Schedule::Interleaved1F1B;
  c.split = kFourStages;
  expect_sharded_stages_equal_unsplit(c);
}

// The same under bf16 compute and fp32 reductions: the tie summed in the gradient shards' fp32,
// against the fp32 reference: bf16 rounding through the tied head's logits moves the losses by up
// to 1.6e-2 here (8e-4 untied); the exact check is pp_train_e2e's gpt2-1f1b-bf16, against a
// reference under the same policy.
TEST(PipelineFsdp, TiedWeightAcrossShardedStagesUnderMixedPrecisionWithinBf16Rounding) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  StagesConfig c;
  c.tied = true;
  c.fsdp = fsdp::FullyShardOptions().mixed_precision(
      fsdp::MixedPrecision().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat));
  c.loss_tolerance = 3e-2;
  c.param_tolerance = 2 * kLr * kSteps;
  expect_sharded_stages_equal_unsplit(c);
}

// ZBV puts the first and the last stage on one rank: one tensor there, which two sharded stages
// cannot both flatten. Refused by the second stage's fully_shard (stage 3 after stage 0 on rank
// 0), and by the Pipeline when the stage holding it unsharded comes first and the sharded one after.
TEST(PipelineFsdp, ATieBetweenTwoShardedStagesOfOneRankIsRefusedByName) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", kPp}, {"dp", kDp}});
  const auto schedule = fsdp::pp::Schedule::ZBV;
  const std::vector<int> local = fsdp::pp::stages_of_rank(mesh.coordinate("pp"), kPp, 4, fsdp::pp::placement_of(schedule));
  {
    ChainedNet model = chained_net(true);
    std::string error;
    std::vector<fsdp::pp::Stage> sharded;  // alive, as a pipeline's stages are
    for (int s : local) {
      sharded.emplace_back(*model.net, model.parts, kFourStages, s);
      error += error_of([&] { sharded.back().fully_shard(mesh.group("dp")); });
    }
    if (mesh.coordinate("pp") == 0) {
      EXPECT_NE(error.find("stage 3 holds 'head.weight', a weight tied across stages that another stage of this "
                           "rank has sharded already"), std::string::npos) << error;
    }
  }
  ChainedNet model = chained_net(true);
  std::vector<fsdp::pp::Stage> stages;
  for (int s : local) {
    stages.emplace_back(*model.net, model.parts, kFourStages, s);
    if (s != 0) stages.back().fully_shard(mesh.group("dp"));  // stage 3 sharded beside stage 0's tensor
  }
  const std::string error = error_of([&] {
    fsdp::pp::Pipeline(std::move(stages), mesh.group_ptr("pp"), summed_cross_entropy,
                       fsdp::pp::PipelineOptions().schedule(schedule).microbatches(kMicrobatches));
  });
  if (mesh.coordinate("pp") != 0) return;  // rank 1 holds neither
  EXPECT_NE(error.find("tied to stage 0 on the same pp rank"), std::string::npos) << error;
}

// Gradient accumulation over whole schedules on sharded stages: two steps of half of each dp
// rank's share, normalized by the share's tokens and not zeroed between, then one SGD step of
// lr 1 (the parameters move by the gradient): the unsplit model's step on the global batch.
// Each step reduces its own sum and adds it into the gradient shard the first one left.
TEST(PipelineFsdp, StepsAccumulatedAddIntoTheStagesGradientShards) {
  if (skipped_off_world4()) GTEST_SKIP() << "a 2 x 2 mesh: pp = 2, dp = 2";
  for (const auto& options :
       {fsdp::FullyShardOptions(), fsdp::FullyShardOptions().strategy(fsdp::ShardingStrategy::NoShard)}) {
    Config c;
    c.fsdp = options;
    SCOPED_TRACE(describe(c));
    ShardedPipeline run(c);
    torch::optim::SGD optim(run.pipe->stage().parameters(), torch::optim::SGDOptions(1.0));
    const GlobalBatch b = global_batch(0);
    const int dp_rank = run.mesh.coordinate("dp");
    const torch::Tensor ids = share_of(b.ids, dp_rank), targets = share_of(b.targets, dp_rank);
    double loss = 0;
    for (int half = 0; half < 2; ++half) {
      loss += run.pipe->step(ids.chunk(2)[half], targets.chunk(2)[half], targets.numel());
    }
    optim.step();
    torch::Tensor mean = torch::tensor({loss}, torch::kDouble);
    fsdp::all_reduce_sum(run.mesh.group("dp"), mean);

    StagedNet reference = seeded_net();
    torch::optim::SGD reference_optim(reference->parameters(), torch::optim::SGDOptions(1.0));
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
        reference->forward(b.ids).reshape({-1, kVocab}), b.targets.reshape({-1}));
    reference_loss.backward();
    reference_optim.step();
    EXPECT_NEAR(mean.item<double>() / kDp, reference_loss.item<double>(), 1e-5);
    const auto whole = reference->named_parameters();
    for (const auto& [name, value] : fsdp::gather_full_params(run.pipe->stage().sharded_model())) {
      EXPECT_LE((value - whole[name]).abs().max().item<double>(), 1e-5) << name;
    }
  }
}

}  // namespace pipeline_fsdp
}  // namespace fsdp_test
