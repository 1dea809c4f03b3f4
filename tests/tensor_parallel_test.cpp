// Tensor parallelism as a LibTorch program uses it: a Megatron MLP of torch::nn::Linear layers
// held as fsdp::tp::Parallel, a LayerNorm run on the sequence shard, an Embedding split over the
// vocabulary, loss parallelism; against the same module unsplit in this process (its own
// autograd, no collective), then under fully_shard over the other mesh dimension with clipping.
// What it refuses, by name. Runs at every world size with tp = W (dist_world1/2/3), and as a
// 2 x 2 mesh at W = 4 (dist_world4_collectives).
#include "dist_env.h"
#include "error_of.h"
#include "tiny_lm.h"

#include <chrono>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>

#include <unistd.h>

namespace fsdp_test {

TEST(TensorParallel, TinyLanguageModelEqualsTheUnsplitModel) {
  // The unsplit model: a residual MLP on the whole sequence.
  TinyLm whole = seeded_model();
  auto [ids, targets] = batch();
  auto whole_loss = whole->loss(whole->forward(ids), targets);
  whole_loss.backward();

  TinyLm split = seeded_model();
  split->tp = world_tp();
  fsdp::tp::parallelize_module(*split, split->tp, tiny_plan());
  auto split_loss = split->loss(split->forward(ids), targets);
  split_loss.backward();

  EXPECT_NEAR(split_loss.item<double>(), whole_loss.item<double>(), 1e-5);
  auto whole_params = whole->named_parameters();
  for (const auto& item : split->named_parameters()) {
    const auto placement = fsdp::tp::placement_of(item.value());
    ASSERT_TRUE(placement) << item.key();
    const torch::Tensor value = fsdp::tp::whole_of(item.value().detach(), *placement);
    const torch::Tensor grad = fsdp::tp::whole_of(item.value().grad(), *placement);
    EXPECT_TRUE(torch::equal(value, whole_params[item.key()])) << item.key();
    // The part parallelize_module kept is the one part_of_whole cuts (Muon's exchange uses it).
    EXPECT_TRUE(torch::equal(fsdp::tp::part_of_whole(whole_params[item.key()], *placement, placement->tp->rank()),
                             item.value().detach())) << item.key();
    EXPECT_TRUE(torch::allclose(grad, whole_params[item.key()].grad(), 1e-5, 1e-6))
        << item.key() << ": max difference " << (grad - whole_params[item.key()].grad()).abs().max().item<double>();
  }
}

TEST(TensorParallel, LossParallelEqualsCrossEntropyOverTheWholeVocabulary) {
  auto tp = world_tp();
  torch::manual_seed(7);
  auto logits = torch::randn({10, kVocab}) * 4;  // large, so that the shift matters
  auto targets = torch::randint(kVocab, {10}, torch::kLong);
  auto whole = logits.clone().requires_grad_();
  auto expected = torch::nn::functional::cross_entropy(whole, targets);
  expected.backward();
  auto local = tp->chunk_along(logits, -1).requires_grad_();
  auto loss = tp->cross_entropy(local, targets);
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6);
  EXPECT_TRUE(torch::allclose(local.grad(), tp->chunk_along(whole.grad(), -1), 1e-6, 1e-7));
}

TEST(TensorParallel, EachCollectiveSendsItsFormulaAndCountsAsTensorParallel) {
  auto tp = world_tp();
  const int64_t t = tp->size(), bytes = 4 * kSeq * kDim * 2;  // a [2, kSeq, kDim] fp32 activation
  auto x = torch::randn({2, kSeq / t, kDim}, torch::requires_grad());
  fsdp::reset_comm_stats();
  auto gathered = tp->gather_sequence(x);
  const auto after_gather = fsdp::comm_stats();
  EXPECT_EQ(after_gather.tp_all_gather_bytes, bytes * (t - 1) / t);
  EXPECT_EQ(after_gather.all_gather_bytes, 0) << "TP's bytes are not FSDP's";
  gathered.sum().backward();  // the reduce-scatter
  EXPECT_EQ(fsdp::comm_stats().tp_reduce_scatter_bytes, bytes * (t - 1) / t);
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full_like(x, static_cast<double>(t))));
  fsdp::reset_comm_stats();
  auto y = torch::randn({2, kSeq, kDim}, torch::requires_grad());
  tp->reduce(y).sum().backward();
  EXPECT_EQ(fsdp::comm_stats().tp_all_reduce_bytes, 2 * bytes * (t - 1) / t);
}

TEST(TensorParallel, TorchLoadOfTheUnsplitModelIsNamedNotSummedTwice) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank's part is the whole";
  const std::string file = "/tmp/fsdp_tp_whole_" + std::to_string(::getpid()) + ".pt";
  TinyLm whole = seeded_model();
  torch::save(whole, file);
  TinyLm split = seeded_model();
  split->tp = world_tp();
  fsdp::tp::parallelize_module(*split, split->tp, tiny_plan());
  torch::load(split, file);  // LibTorch's load sets every parameter to the file's whole tensor
  std::remove(file.c_str());
  const std::string error = error_of([&] { split->forward(batch().first); });
  EXPECT_NE(error.find("'embed.weight' is [36, 12] but this rank's part of it is"), std::string::npos) << error;
  EXPECT_NE(error.find("torch::load of an unsplit model"), std::string::npos) << error;
}

TEST(TensorParallel, APlanThatDoesNotFitTheModelIsRefusedByName) {
  auto tp = world_tp();
  TinyLm model = seeded_model();
  EXPECT_NE(error_of([&] { fsdp::tp::parallelize_module(*model, tp, {{"h.*.attn", fsdp::tp::SequenceParallel()}}); })
                .find("'h.*.attn' matches no module"), std::string::npos);
  EXPECT_NE(error_of([&] {
              fsdp::tp::parallelize_module(*model, tp, {{"norm", fsdp::tp::ColwiseParallel()}});
            }).find("ColwiseParallel on 'norm': it splits a Linear"), std::string::npos);
  EXPECT_NE(error_of([&] {
              fsdp::tp::parallelize_module(*model, tp, {{"mlp.*", fsdp::tp::ColwiseParallel()},
                                                        {"mlp.up", fsdp::tp::ColwiseParallel()}});
            }).find("'mlp.up' is matched by two entries"), std::string::npos);
  if (tp->size() > 1) {
    struct OddImpl : torch::nn::Module {
      OddImpl() { fc = register_module("fc", torch::nn::Linear(4, 7)); }
      fsdp::tp::Parallel<torch::nn::Linear> fc{nullptr};
    };
    auto odd = std::make_shared<OddImpl>();
    const std::string error = error_of([&] { fsdp::tp::parallelize_module(*odd, tp, {{"fc", fsdp::tp::ColwiseParallel()}}); });
    EXPECT_NE(error.find("'fc.weight' has 7 along dimension 0, which does not split"), std::string::npos) << error;
  }
}

}  // namespace fsdp_test

namespace fsdp_test {

// A mesh built in another order on one rank is refused at once on every rank, naming what each
// rank gave (without the check, each waited in its subgroups' rendezvous until the timeout).
TEST(TensorParallelMesh, AMeshBuiltDifferentlyOnOneRankIsRefusedAtOnceNamingEachRanks) {
  const int world = dist().world_size(), last = world - 1;
  if (world % 2 != 0) GTEST_SKIP() << "needs an even world";
  std::vector<fsdp::MeshDim> dims = {{"dp", world / 2}, {"tp", 2}};
  if (dist().rank() == last) std::swap(dims[0], dims[1]);
  const auto started = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { fsdp::DeviceMesh mesh(dist().world, dims); });
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_NE(error.find("the ranks built different meshes: rank 0 gave dp " + std::to_string(world / 2) + " x tp 2"),
            std::string::npos) << error;
  EXPECT_NE(error.find("rank " + std::to_string(last) + " gave tp 2 x dp " + std::to_string(world / 2)),
            std::string::npos) << error;
  EXPECT_LT(seconds, 30) << "refused only after " << seconds << " s";
}

// The 2-D mesh: tp 2 where the world is even (W = 4: 2 x 2), else tp 1.
TEST(TensorParallelMesh, FsdpOverTheOtherDimensionTrainsAsTheUnsplitModel) {
  const int world = dist().world_size(), tp_size = world % 2 == 0 ? 2 : 1, dp_size = world / tp_size;
  fsdp::DeviceMesh mesh(dist().world, {{"dp", dp_size}, {"tp", tp_size}});
  EXPECT_EQ(mesh.group("tp").size(), tp_size);
  EXPECT_EQ(mesh.coordinate("tp"), dist().rank() % tp_size) << "tp is the innermost dimension";
  EXPECT_EQ(mesh.coordinate("dp"), dist().rank() / tp_size);

  // The global batch: dp_size x 2 rows; dp rank r trains rows [2r, 2r + 2), every tp rank alike.
  torch::manual_seed(9);
  const auto ids = torch::randint(kVocab, {2 * dp_size, kSeq}, torch::kLong);
  const auto targets = torch::randint(kVocab, {2 * dp_size, kSeq}, torch::kLong);
  const auto mine = [&](const torch::Tensor& t) { return t.narrow(0, 2 * mesh.coordinate("dp"), 2); };

  // SGD is sensitive to the clipping's scale (AdamW nearly is not): a wrong norm shows.
  TinyLm whole = seeded_model();
  torch::optim::SGD whole_sgd(whole->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  torch::optim::StepLR whole_schedule(whole_sgd, 1, 0.5);
  TinyLm split = seeded_model();
  split->tp = std::make_shared<fsdp::tp::TensorParallel>(mesh.group_ptr("tp"));
  fsdp::tp::parallelize_module(*split, split->tp, tiny_plan());
  auto model = fsdp::fully_shard(split, mesh.group("dp"));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
  torch::optim::StepLR schedule(sgd, 1, 0.5);
  for (int step = 0; step < 3; ++step) {
    whole_sgd.zero_grad();
    whole->loss(whole->forward(ids), targets).backward();
    const double whole_norm = torch::nn::utils::clip_grad_norm_(whole->parameters(), 0.1);
    whole_sgd.step();
    whole_schedule.step();

    sgd.zero_grad();
    model->loss(model->forward(mine(ids)), mine(targets)).backward();
    const double norm = fsdp::clip_grad_norm_(model->parameters(), 0.1);
    sgd.step();
    schedule.step();
    EXPECT_NEAR(norm, whole_norm, 1e-5 * whole_norm) << "step " << step;
  }
  // The full state dict of a 2-D model: each parameter whole, gathered over both dimensions.
  auto whole_params = whole->named_parameters();
  for (auto& [name, value] : fsdp::gather_full_params(model)) {
    ASSERT_EQ(value.sizes(), whole_params[name].sizes()) << name;
    EXPECT_TRUE(torch::allclose(value, whole_params[name], 1e-4, 1e-6))
        << name << ": max difference " << (value - whole_params[name]).abs().max().item<double>();
  }
}

}  // namespace fsdp_test
