// Parity: FSDP training over W real ranks computes what unsharded training on the same global
// batch computes. Every rank also runs the reference in-process, so the comparison needs no file.
#include "dist_env.h"
#include "core/fsdp_state.h"
#include "core/sharded_model.h"
#include "parity_check.h"
#include "test_models.h"

#include "trainer.h"

#include <fsdp/memory.h>
#include <fsdp/trace.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

namespace fsdp_test {
namespace {

TEST(Parity, GptMatchesUnshardedReferenceStepByStep) {
  auto o = tiny_gpt_run(/*layers=*/3, /*dim=*/48, /*heads=*/4, /*seq=*/32, /*batch=*/3, /*steps=*/8);
  auto sharded = gpt::train(o, &dist());
  o.reference_world_size = dist().world_size();
  auto reference = gpt::train(o, nullptr);

  expect_same_losses(sharded.losses, reference.losses);
  EXPECT_LT(sharded.losses.back(), sharded.losses.front());  // it learns
  // Noise-driven elements move at most lr per step (AdamW's update is bounded by ~lr).
  expect_same_params(sharded.final_params, as_map(reference.final_params), o.lr * o.steps);
}

TEST(Parity, PrefetchAndRateLimiterChangeNothingNumerically) {
  auto o = tiny_gpt_run(/*layers=*/4, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/3);
  o.fsdp.backward_prefetch(fsdp::BackwardPrefetch::None).limit_all_gathers(0);
  const auto baseline = gpt::train(o, &dist());
  for (auto prefetch : {fsdp::BackwardPrefetch::BackwardPre, fsdp::BackwardPrefetch::BackwardPost}) {
    for (int limit : {0, 1, 2}) {
      for (bool forward_prefetch : {false, true}) {
        o.fsdp.backward_prefetch(prefetch).limit_all_gathers(limit).forward_prefetch(forward_prefetch);
        const auto run = gpt::train(o, &dist());
        EXPECT_EQ(run.losses, baseline.losses)
            << fsdp::to_string(prefetch) << " limit " << limit << " forward " << forward_prefetch;
        for (size_t i = 0; i < run.final_params.size(); ++i) {
          EXPECT_TRUE(torch::equal(run.final_params[i].second, baseline.final_params[i].second))
              << run.final_params[i].first;
        }
      }
    }
  }
}

// The units' all-gathers, in the order the communication thread ran them (it runs them one at a
// time, in the order they were issued), read from the trace of what ran since start_trace().
std::vector<std::string> all_gathers_since_trace(const std::string& path) {
  fsdp::write_trace(path, dist().rank());
  std::ifstream in(path);
  const auto trace = nlohmann::json::parse(in);
  std::vector<std::pair<double, std::string>> spans;
  for (const auto& e : trace["traceEvents"]) {
    const std::string name = e.value("name", "");
    if (e.value("ph", "") == "X" && name.rfind("all_gather ", 0) == 0) {
      spans.emplace_back(e["ts"].get<double>(), name.substr(11));
    }
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::string> names;
  for (const auto& span : spans) names.push_back(span.second);
  std::remove(path.c_str());
  return names;
}

// Backward prefetch: the root's backward gathers the unit that ran last, each unit's backward the
// one before it, so backward gathers the blocks exactly once each, in reverse forward order. (A
// prefetch of the wrong unit changes no number, only time and memory.)
void expect_backward_gathers_in_reverse_forward_order(fsdp::BackwardPrefetch prefetch) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank holds whole units: nothing to gather";
  auto o = tiny_gpt_run(/*layers=*/4, /*dim=*/32, /*heads=*/2, /*seq=*/16, /*batch=*/2, /*steps=*/1);
  auto model = fsdp::fully_shard(gpt::make_gpt(o.model, 1), *dist().world,
                                 fsdp::FullyShardOptions().backward_prefetch(prefetch));
  auto x = torch::randint(0, 256, {2, 16}, at::detail::createCPUGenerator(3));
  const std::string path = "/tmp/fsdp-prefetch-test-" + std::to_string(::getpid()) + ".json";
  fsdp::start_trace();
  auto logits = model(x);
  const auto forward = all_gathers_since_trace(path);  // root, h.0, h.1, ...
  ASSERT_EQ(forward.size(), 5u);
  fsdp::start_trace();
  logits.sum().backward();
  const auto backward = all_gathers_since_trace(path);
  const std::vector<std::string> expected(forward.rbegin(), forward.rend() - 1);  // not the root
  EXPECT_EQ(backward, expected);
}

TEST(Prefetch, BackwardPreGathersTheBlocksOnceEachInReverseForwardOrder) {
  expect_backward_gathers_in_reverse_forward_order(fsdp::BackwardPrefetch::BackwardPre);
}

TEST(Prefetch, NoPrefetchGathersTheBlocksOnceEachInReverseForwardOrder) {
  expect_backward_gathers_in_reverse_forward_order(fsdp::BackwardPrefetch::None);
}

TEST(Prefetch, BackwardPostGathersTheBlocksOnceEachInReverseForwardOrder) {
  expect_backward_gathers_in_reverse_forward_order(fsdp::BackwardPrefetch::BackwardPost);
}

// BACKWARD_PRE: when a unit's backward starts, the model gathers the unit whose backward comes
// next at once; without backward prefetch that unit is gathered only when its own backward
// starts. Probed between the two: the gradient of a tensor that only the later unit's backward
// produces, read before the earlier unit's own pre-backward hook can run.
TEST(Prefetch, BackwardPreGathersTheNextUnitAsSoonAsABackwardStarts) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank holds whole units: nothing to gather";
  constexpr int64_t kWidth = 32;
  auto first_unit_gathered_at_probe = [&](fsdp::BackwardPrefetch prefetch) {
    torch::manual_seed(0);
    std::shared_ptr<fsdp::FsdpState> state;
    std::optional<bool> gathered;
    torch::nn::Sequential net(
        torch::nn::Linear(kWidth, kWidth), torch::nn::Functional([&](at::Tensor x) {
          at::Tensor y = x * 1;  // its gradient comes from unit "2"'s backward, before x's
          y.register_hook([&](const at::Tensor&) {
            for (const auto& group : state->units()) {
              if (group->name() == "0") gathered = group->sharded_state() != fsdp::ShardedState::Sharded;
            }
          });
          return y;
        }),
        torch::nn::Linear(kWidth, kWidth), torch::nn::Linear(kWidth, kWidth));
    fsdp::wrap_blocks<torch::nn::Linear>(net);
    auto model = fsdp::fully_shard(net, *dist().world, fsdp::FullyShardOptions().backward_prefetch(prefetch));
    state = model.sharded_model().impl().engine;
    model(torch::ones({1, kWidth})).sum().backward();
    return gathered;
  };
  EXPECT_EQ(first_unit_gathered_at_probe(fsdp::BackwardPrefetch::BackwardPre), std::optional<bool>(true));
  EXPECT_EQ(first_unit_gathered_at_probe(fsdp::BackwardPrefetch::None), std::optional<bool>(false));
}

// Forward prefetch (on by default): from the second iteration on, unit k+1's all-gather is issued
// when unit k's forward starts, so its unsharded buffer (allocated on the caller's thread at
// issue) already exists between the two units; without it, not yet.
TEST(Prefetch, ForwardPrefetchGathersTheNextUnitBeforeItsForwardByDefault) {
  if (dist().world_size() == 1) GTEST_SKIP() << "one rank holds whole units: nothing to gather";
  constexpr int64_t kWidth = 128;
  auto bytes_between_units = [&](const fsdp::FullyShardOptions& options) {
    torch::manual_seed(0);
    int64_t at_probe = 0;
    torch::nn::Sequential net(torch::nn::Linear(kWidth, kWidth), torch::nn::Functional([&](at::Tensor x) {
                                at_probe = fsdp::memory_stats().current_bytes;
                                return x;
                              }),
                              torch::nn::Linear(kWidth, kWidth), torch::nn::Linear(kWidth, kWidth));
    fsdp::wrap_blocks<torch::nn::Linear>(net);
    auto model = fsdp::fully_shard(net, *dist().world, options);
    const auto x = torch::ones({1, kWidth});
    model(x).sum().backward();  // the first iteration records the order
    const int64_t start = fsdp::memory_stats().current_bytes;
    model(x).sum().backward();
    return at_probe - start;
  };
  const int64_t with = bytes_between_units(fsdp::FullyShardOptions());
  const int64_t without = bytes_between_units(fsdp::FullyShardOptions().forward_prefetch(false));
  const int64_t next_unit_full = kWidth * (kWidth + 1) * 4;  // padded to W: at most W-1 more
  EXPECT_GE(with - without, next_unit_full);
  EXPECT_LE(with - without, next_unit_full + 4 * dist().world_size());
}

TEST(Parity, AwkwardModelMatchesReference) {
  const int world = dist().world_size(), rank = dist().rank();
  const int64_t rows_per_rank = 5;
  OddNet reference = make_odd_net(11);
  OddNet net = make_odd_net(11);
  auto model = fsdp::fully_shard(net, *dist().world);
  torch::optim::AdamW reference_optim(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW optim(model->parameters(), torch::optim::AdamWOptions(1e-2));

  for (int64_t step = 0; step < 6; ++step) {
    auto [x, y] = odd_batch(step, world * rows_per_rank);
    reference_optim.zero_grad();
    auto reference_loss = torch::mse_loss(reference(x), y);
    reference_loss.backward();
    reference_optim.step();

    optim.zero_grad();
    auto local = torch::mse_loss(model(x.narrow(0, rank * rows_per_rank, rows_per_rank)),
                                 y.narrow(0, rank * rows_per_rank, rows_per_rank));
    local.backward();
    optim.step();
    auto loss = local.detach().clone();
    fsdp::all_reduce_sum(*dist().world, loss);
    EXPECT_NEAR(loss.item<double>() / world, reference_loss.item<double>(),
                kLossRelTol * reference_loss.item<double>())
        << "step " << step;
  }
  std::map<std::string, torch::Tensor> expected;  // the full state dict: parameters and buffers
  for (auto& item : reference->named_parameters()) expected[item.key()] = item.value().detach();
  for (auto& item : reference->named_buffers()) expected[item.key()] = item.value().detach();
  expect_same_params(fsdp::gather_full_params(model), expected);
}

TEST(Parity, ParametersSeenByTheOptimizerAreThisRanksShards) {
  OddNet net = make_odd_net(3);
  int64_t total = 0;
  for (auto& p : net->parameters()) total += p.numel();
  auto model = fsdp::fully_shard(net, *dist().world);
  int64_t local = 0;
  for (auto& p : model->parameters()) local += p.numel();
  int64_t shard_total = 0;
  for (const auto& unit : model.units()) shard_total += unit.shard_numel;
  EXPECT_LE(local, shard_total);
  auto sum = torch::tensor({local}, torch::kLong);
  fsdp::all_reduce_sum(*dist().world, sum);
  EXPECT_EQ(sum.item<int64_t>(), total);  // the shards partition the model exactly
}

TEST(Parity, InferenceUnderNoGradReducesNothingAndMatches) {
  OddNet reference = make_odd_net(5);
  OddNet net = make_odd_net(5);
  auto model = fsdp::fully_shard(net, *dist().world);
  auto [x, y] = odd_batch(0, 4);
  model->eval();
  const auto before = fsdp::comm_stats();
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = model(x);
  }
  EXPECT_EQ(fsdp::comm_stats().reduce_scatter_bytes, before.reduce_scatter_bytes);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_LE((out - reference(x).detach()).abs().max().item<double>(), 1e-6);
  // Every unit is sharded again: the parameters are back to this rank's 1-D pieces (with one
  // rank there is nothing to shard: they keep their shapes).
  if (dist().world_size() > 1) {
    for (auto& p : model->parameters()) EXPECT_LE(p.dim(), 1);
  }
}

TEST(Parity, SequentialBlocksWrappedByType) {
  auto build = [] {
    torch::manual_seed(21);
    return torch::nn::Sequential(torch::nn::Linear(6, 9), torch::nn::Tanh(),
                                 torch::nn::Linear(9, 9), torch::nn::Tanh(),
                                 torch::nn::Linear(9, 2));
  };
  auto reference = build();
  auto net = build();
  std::vector<std::string> names_before;
  for (auto& item : net->named_parameters()) names_before.push_back(item.key());
  EXPECT_EQ(fsdp::wrap_blocks<torch::nn::Linear>(net), 3);
  auto model = fsdp::fully_shard(net, *dist().world);
  EXPECT_EQ(model.units().size(), 4u);  // root + 3 Linear units
  std::vector<std::string> names_after;
  for (auto& item : net->named_parameters()) names_after.push_back(item.key());
  EXPECT_EQ(names_before, names_after);  // wrapping does not rename parameters

  // One SGD step on the same batch everywhere: the gathered result must equal the reference's.
  torch::optim::SGD reference_optim(reference->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1));
  auto x = torch::randn({4, 6}, at::detail::createCPUGenerator(5));
  model(x).pow(2).sum().backward();
  optim.step();
  reference->forward(x).pow(2).sum().backward();
  reference_optim.step();
  std::map<std::string, torch::Tensor> expected;
  for (auto& item : reference->named_parameters()) expected[item.key()] = item.value().detach();
  expect_same_params(fsdp::gather_full_params(model), expected);
}

}  // namespace
}  // namespace fsdp_test
