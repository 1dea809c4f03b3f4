// What FSDP inside a pipeline stage runs besides sharding, on two ranks (pp 2 x dp 1: each stage
// sharded over a dp group of one): bf16 mixed precision, whose gradient held across the step's
// micro-batches must be the sum of each micro-batch's rounded gradient, as the unsplit model's
// accumulation makes it ([Note: a kept gradient summed wide] in core/flat_param.cpp); activation
// checkpointing inside a stage ([Note: activation checkpointing inside a stage]), which trains
// what the stage trains without it while keeping less memory between a micro-batch's forward
// and its backward, and is refused under ZBV by name; and fsdp::clip_grad_norm_ on a stage's
// parameters, refused by name ([Note: calls that see one stage] in core/stage_marks.cpp).
#include "dist_env.h"
#include "error_of.h"
#include "pipeline_model.h"

#include <fsdp/clip.h>
#include <fsdp/fully_shard.h>
#include <fsdp/memory.h>
#include <fsdp/pipeline.h>

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
// Named, not anonymous: the unity build compiles this file with the other pipeline tests.
namespace pipeline_stage_features {

constexpr int kStages = 2, kMicrobatches = 4;
constexpr int64_t kRows = 16, kTokens = 6;

const std::vector<std::vector<std::string>> kSplit{{"wte", "h.0"}, {"h.1", "h.2", "h.3", "ln_f", "head"}};

// In fp32 also under bf16 (the logits cast), as a mixed-precision program computes its loss.
torch::Tensor summed_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat).reshape({-1, kPpVocab}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

struct Batch {
  torch::Tensor ids, targets;
};
Batch batch_of_step(int step, int64_t rows = kRows, int64_t tokens = kTokens) {
  torch::manual_seed(300 + step);
  return {torch::randint(kPpVocab, {rows, tokens}, torch::kLong), torch::randint(kPpVocab, {rows, tokens}, torch::kLong)};
}

bool skipped_off_world2() { return dist().world_size() != kStages; }

// This rank's stage of `net`, sharded over its dp group of one with `options`, in a pipeline.
struct StagePipeline {
  StagePipeline(const fsdp::FullyShardOptions& options, fsdp::pp::Schedule schedule)
      : mesh(dist().world, {{"pp", kStages}, {"dp", 1}}), net(seeded_pp_net()) {
    fsdp::pp::Stage stage(*net, parts_of(net), kSplit, mesh.coordinate("pp"));
    stage.fully_shard(mesh.group("dp"), options);
    pipe = std::make_unique<fsdp::pp::Pipeline>(std::move(stage), mesh.group_ptr("pp"), summed_loss,
                                                fsdp::pp::PipelineOptions().schedule(schedule).microbatches(kMicrobatches));
  }
  fsdp::DeviceMesh mesh;
  PpNet net;
  std::unique_ptr<fsdp::pp::Pipeline> pipe;
};

// The unsplit model's gradient of the step's mean loss under bf16 compute, accumulated as
// gradient accumulation does: each micro-batch's backward on bf16 parameters gives a bf16
// gradient, added in fp32 to the sum of the earlier ones.
std::map<std::string, torch::Tensor> bf16_accumulated_gradients(const Batch& b) {
  PpNet reference = seeded_pp_net();
  reference->to(torch::kBFloat16);
  std::map<std::string, torch::Tensor> sums;
  const auto ids = b.ids.chunk(kMicrobatches, 0), targets = b.targets.chunk(kMicrobatches, 0);
  for (int m = 0; m < kMicrobatches; ++m) {
    reference->zero_grad();
    torch::Tensor loss = summed_loss(reference->forward(ids[m]), targets[m]) / static_cast<double>(b.targets.numel());
    loss.backward();
    for (const auto& item : reference->named_parameters()) {
      const torch::Tensor grad = item.value().grad().to(torch::kFloat);
      auto it = sums.find(item.key());
      if (it == sums.end()) {
        sums[item.key()] = grad;
      } else {
        it->second += grad;
      }
    }
  }
  return sums;
}

// bf16 compute and bf16 reductions (the reduce dtype defaulting to param_dtype): the stage holds
// one unsharded gradient across its 4 micro-batches. Each stage computes what the unsplit bf16
// model computes on the same rows, so its held sum must be the reference's fp32 sum of the
// micro-batches' bf16 gradients, to fp32 summation (measured: 0). Summed in bf16 instead, every
// partial sum rounds to 8 bits: ~1e-3 of the gradient's size off (the bound is 1e-5 of it).
TEST(PipelineStageFeatures, Bf16HeldGradientIsTheFp32SumOfEachMicroBatchsGradient) {
  if (skipped_off_world2()) GTEST_SKIP() << "pp 2 x dp 1";
  const auto bf16 = fsdp::MixedPrecision().param_dtype(torch::kBFloat16);
  for (const auto schedule : {fsdp::pp::Schedule::GPipe, fsdp::pp::Schedule::OneFOneB}) {
    StagePipeline run(fsdp::FullyShardOptions().mixed_precision(bf16), schedule);
    const Batch b = batch_of_step(0);
    run.pipe->step(b.ids, b.targets);
    const auto expected = bf16_accumulated_gradients(b);
    double worst = 0;
    for (const auto& item : run.pipe->stage().named_parameters()) {
      const torch::Tensor want = expected.at(item.key()).flatten();
      const torch::Tensor got = item.value().grad();
      ASSERT_TRUE(got.defined()) << item.key();
      ASSERT_EQ(got.numel(), want.numel()) << item.key() << ": a dp group of one holds the whole parameter";
      const double relative = ((got.flatten() - want).abs().max() / want.abs().max()).item<double>();
      EXPECT_LE(relative, 1e-5) << item.key() << " (" << fsdp::pp::to_string(schedule) << ")";
      worst = std::max(worst, relative);
    }
    std::printf("pipeline bf16 %s stage %d: held gradient within %.3g (relative to its max) of the fp32 sum of "
                "the micro-batches' bf16 gradients\n",
                fsdp::pp::to_string(schedule).c_str(), run.mesh.coordinate("pp"), worst);
  }
}

// The same code under plain FSDP: no_sync accumulation over a shard group of one rank (each rank
// its own model), bf16 compute and reductions: after 3 no_sync backwards and a synchronising one,
// the gradient is the fp32 sum of the 4 micro-batches' bf16 gradients, as gradient accumulation
// with a reduction per micro-batch makes it.
TEST(PipelineStageFeatures, PlainNoSyncAccumulatesBf16GradientsInFp32) {
  if (skipped_off_world2()) GTEST_SKIP() << "pp 2 x dp 1";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", kStages}, {"dp", 1}});
  auto model = fsdp::fully_shard(seeded_pp_net(), mesh.group("dp"),
                                 fsdp::FullyShardOptions().mixed_precision(
                                     fsdp::MixedPrecision().param_dtype(torch::kBFloat16)));
  const Batch b = batch_of_step(0);
  const auto ids = b.ids.chunk(kMicrobatches, 0), targets = b.targets.chunk(kMicrobatches, 0);
  for (int m = 0; m < kMicrobatches; ++m) {
    auto loss = [&] { return summed_loss(model(ids[m]), targets[m]) / static_cast<double>(b.targets.numel()); };
    if (m + 1 < kMicrobatches) {
      fsdp::NoSyncGuard no_sync(model.sharded_model());
      loss().backward();
    } else {
      loss().backward();
    }
  }
  const auto expected = bf16_accumulated_gradients(b);
  double worst = 0;
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor want = expected.at(item.key()).flatten();
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const double relative = ((item.value().grad().flatten() - want).abs().max() / want.abs().max()).item<double>();
    EXPECT_LE(relative, 1e-5) << item.key();
    worst = std::max(worst, relative);
  }
  std::printf("fsdp bf16 no_sync x %d over a group of one: gradient within %.3g of the fp32 sum of the "
              "micro-batches' bf16 gradients\n", kMicrobatches - 1, worst);
}

// The stage's step with each part recomputed in backward, against the same stage without: the
// same losses and parameters after 3 AdamW steps (recomputation replays the same ops), and a
// lower peak of the step's memory above its start (GPipe: all 4 micro-batches' activations are
// kept before the first backward; recomputing keeps only each part's input). A batch whose
// activations outweigh the tiny model's parameters and gradients: 16 rows of 32 tokens a
// micro-batch.
constexpr int64_t kMemoryRows = 64, kMemoryTokens = 32;
struct StepTrace {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
  int64_t peak_above_start = 0;  // the largest, over the steps
};
StepTrace train_three_steps(bool checkpointed) {
  StagePipeline run(fsdp::FullyShardOptions().activation_checkpointing(checkpointed), fsdp::pp::Schedule::GPipe);
  torch::optim::AdamW optim(run.pipe->stage().parameters(), torch::optim::AdamWOptions(1e-2));
  StepTrace trace;
  for (int step = 0; step < 3; ++step) {
    const Batch b = batch_of_step(step, kMemoryRows, kMemoryTokens);
    optim.zero_grad();
    fsdp::reset_peak_memory();
    const int64_t start = fsdp::memory_stats().current_bytes;
    trace.losses.push_back(run.pipe->step(b.ids, b.targets));
    trace.peak_above_start = std::max(trace.peak_above_start, fsdp::memory_stats().peak_bytes - start);
    optim.step();
  }
  for (const auto& p : run.pipe->stage().parameters()) trace.params.push_back(p.detach().clone());
  return trace;
}

TEST(PipelineStageFeatures, CheckpointedStageTrainsTheSameWithLessMemory) {
  if (skipped_off_world2()) GTEST_SKIP() << "pp 2 x dp 1";
  ASSERT_TRUE(fsdp::memory_counter_installed());
  const StepTrace plain = train_three_steps(false);
  const StepTrace recomputed = train_three_steps(true);
  ASSERT_EQ(plain.losses.size(), recomputed.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_NEAR(recomputed.losses[i], plain.losses[i], 1e-6) << i;
  ASSERT_EQ(plain.params.size(), recomputed.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_LE((plain.params[i] - recomputed.params[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
  }
  EXPECT_LT(recomputed.peak_above_start, plain.peak_above_start);
  std::printf("pipeline stage %d, GPipe x %d micro-batches: step peak above its start %lld bytes recomputing "
              "each part, %lld without (%.2fx)\n",
              dist().rank(), kMicrobatches, (long long)recomputed.peak_above_start, (long long)plain.peak_above_start,
              static_cast<double>(recomputed.peak_above_start) / static_cast<double>(plain.peak_above_start));
}

// ZBV: two stages per rank (rank r holds r and 3 - r), each recomputing its parts.
TEST(PipelineStageFeatures, CheckpointingUnderZbvIsRefusedByName) {
  if (skipped_off_world2()) GTEST_SKIP() << "pp 2 x dp 1";
  fsdp::DeviceMesh mesh(dist().world, {{"pp", kStages}, {"dp", 1}});
  PpNet net = seeded_pp_net();
  const std::vector<std::vector<std::string>> split{{"wte", "h.0"}, {"h.1"}, {"h.2"}, {"h.3", "ln_f", "head"}};
  const auto schedule = fsdp::pp::Schedule::ZBV;
  std::vector<fsdp::pp::Stage> stages;
  for (int s : fsdp::pp::stages_of_rank(mesh.coordinate("pp"), kStages, 4, fsdp::pp::placement_of(schedule))) {
    stages.emplace_back(*net, parts_of(net), split, s);
    stages.back().fully_shard(mesh.group("dp"), fsdp::FullyShardOptions().activation_checkpointing(true));
  }
  const std::string error = error_of([&] {
    fsdp::pp::Pipeline(stages, mesh.group_ptr("pp"), summed_loss,
                       fsdp::pp::PipelineOptions().schedule(schedule).microbatches(kMicrobatches));
  });
  EXPECT_NE(error.find("recomputes its parts in backward (FullyShardOptions::activation_checkpointing) and the "
                       "schedule is ZBV"),
            std::string::npos)
      << error;
}

// fsdp::clip_grad_norm_ on a stage's parameters (or its sharded model) would clip each pp rank by
// its own stage's norm: refused, naming the parameter and fsdp::pp::clip_grad_norm_. Once the
// pipeline is gone the parameters are a model's like any other.
TEST(PipelineStageFeatures, FsdpClipOnAStagesParametersIsRefusedByName) {
  if (skipped_off_world2()) GTEST_SKIP() << "pp 2 x dp 1";
  PpNet net = seeded_pp_net();
  {
    fsdp::DeviceMesh mesh(dist().world, {{"pp", kStages}, {"dp", 1}});
    fsdp::pp::Stage stage(*net, parts_of(net), kSplit, mesh.coordinate("pp"));
    const std::string first_name = stage.named_parameters().begin()->key();
    fsdp::pp::Pipeline pipe(std::move(stage), mesh.group_ptr("pp"), summed_loss,
                            fsdp::pp::PipelineOptions().microbatches(2));
    const Batch b = batch_of_step(0);
    pipe.step(b.ids, b.targets);
    std::string error = error_of([&] { fsdp::clip_grad_norm_(pipe.stage().parameters(), 1.0); });
    EXPECT_NE(error.find("'" + first_name + "' is a parameter of stage " + std::to_string(mesh.coordinate("pp")) +
                         " of 2 of a pipeline"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("call fsdp::pp::clip_grad_norm_(pipeline, max_norm)"), std::string::npos) << error;
    error = error_of([&] { fsdp::clip_grad_norm_(net->parameters(), 1.0); });  // the whole model's, this stage's among them
    EXPECT_NE(error.find("fsdp::pp::clip_grad_norm_"), std::string::npos) << error;
    EXPECT_GT(fsdp::pp::clip_grad_norm_(pipe, 1e6), 0.0);  // the pipeline's own
  }
  {
    StagePipeline sharded(fsdp::FullyShardOptions(), fsdp::pp::Schedule::OneFOneB);
    const std::string error =
        error_of([&] { fsdp::clip_grad_norm_(sharded.pipe->stage().sharded_model(), 1.0); });
    EXPECT_NE(error.find("call fsdp::pp::clip_grad_norm_(pipeline, max_norm)"), std::string::npos) << error;
  }
  const Batch b = batch_of_step(1);
  torch::nn::functional::cross_entropy(net->forward(b.ids).reshape({-1, kPpVocab}), b.targets.reshape({-1})).backward();
  EXPECT_GT(fsdp::clip_grad_norm_(net->parameters(), 1e6), 0.0);  // no pipeline now: an ordinary model
}

}  // namespace pipeline_stage_features
}  // namespace fsdp_test
