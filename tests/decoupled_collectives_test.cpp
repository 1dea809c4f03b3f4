// Decoupled collectives ([Note: decoupled collectives] in src/comm/shm_collectives.cpp) with real
// ranks over real Gloo: a published shard's unsharded buffer is on the board (every rank's shard
// in place, no copy) for rank 0 before any peer takes part, a
// posted reduce-scatter returns before the peers post theirs and sums bitwise as the ring does,
// and FSDP training through them is bitwise the training through the ring, also where the shards
// change outside a step (an edit after an evaluation forward or after a forward without backward,
// a load between a forward and its backward) and a unit is called alone after it.
#include "dist_env.h"
#include "collective_testing.h"
#include "test_models.h"

#include "comm/collectives.h"
#include "comm/published_shards.h"
#include "comm/publishing_collectives.h"
#include "comm/shm_collectives.h"
#include "comm/shm_segment.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

namespace fsdp_test {
namespace {

constexpr auto kShortTimeout = std::chrono::seconds(5);

// Rank 0 runs `alone` while every peer waits for it to finish (a store key), then the peers run
// `alone` too: nothing rank 0 does in it can wait for a peer (it would time out instead).
void rank0_first(fsdp::ProcessGroup& group, const std::string& key, const std::function<void()>& alone) {
  if (group.rank() == 0) {
    try {
      alone();
    } catch (...) {
      group.store().set(key, std::vector<uint8_t>{0});  // the peers go on, and fail in their turn
      throw;
    }
    group.store().set(key, std::vector<uint8_t>{1});
  } else {
    group.store().wait({key}, std::chrono::seconds(60));
    alone();
  }
}

// The address ranges this process maps of shared-memory collectives' segments (boards of
// published shards among them), from /proc/self/maps.
std::vector<std::pair<uintptr_t, uintptr_t>> segment_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(std::string("/dev/shm/") + fsdp::kShmSegmentPrefix) == std::string::npos) continue;
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &begin, &end) == 2) ranges.emplace_back(begin, end);
  }
  return ranges;
}

size_t mapped_segments() { return segment_mappings().size(); }

// Whether `p` lies in a mapping of a shared-memory collectives' segment.
bool in_shared_segment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  for (const auto& [begin, end] : segment_mappings()) {
    if (begin <= address && address < end) return true;
  }
  return false;
}

// A unit that notes where its weight's bytes are during its forward, and can fail there.
struct WhereImpl : torch::nn::Module {
  WhereImpl() { weight = register_parameter("weight", torch::randn({16, 16})); }
  torch::Tensor forward(const torch::Tensor& x) {
    seen = weight.data_ptr();
    TORCH_CHECK(!fail, "the unit's forward failed (on purpose)");
    return x.matmul(weight);
  }
  torch::Tensor weight;
  const void* seen = nullptr;
  bool fail = false;
};
TORCH_MODULE(Where);

struct WhereNetImpl : torch::nn::Module {
  WhereNetImpl() {
    inner = register_module("inner", Where());
    head = register_module("head", torch::nn::Linear(16, 1));  // the root's
    inner_unit = inner;
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::tanh(inner_unit(x))); }
  Where inner{nullptr};
  torch::nn::Linear head{nullptr};
  fsdp::Unit<Where> inner_unit;
};
TORCH_MODULE(WhereNet);

// Shared-memory collectives over a group of the world's ranks with a short timeout (a rank that
// waits where it should not fails fast), and the ring over the world as the reference.
struct ShmAndRing {
  explicit ShmAndRing(const std::string& name)
      : group(group_with(name, {}, kShortTimeout)),
        shm(fsdp::make_shm_collectives(*group)),
        publishing(shm ? fsdp::publishing_side(*shm) : nullptr),
        ring(fsdp::make_ring_collectives(*dist().world)) {}
  std::shared_ptr<fsdp::ProcessGroup> group;
  std::unique_ptr<fsdp::Collectives> shm;
  fsdp::PublishingCollectives* publishing;  // shm's board and postings
  std::unique_ptr<fsdp::Collectives> ring;
};

TEST(DecoupledCollectives, PublishedShardsAreGatheredWithoutThePeers) {
  const int w = dist().world->size();
  if (w == 1) GTEST_SKIP() << "a group of one gathers nothing";
  auto [group, shm, publishing, ring] = ShmAndRing("published");
  ASSERT_TRUE(publishing);
  // Odd sizes in two dtypes, and one shard too large to publish (gathered in rounds).
  const std::vector<std::pair<int64_t, at::ScalarType>> kinds = {
      {1, at::kFloat}, {37, at::kFloat}, {1001, at::kBFloat16}, {4099, at::kFloat},
      {fsdp::kPublishedUnitBytes / 4, at::kFloat}};
  const size_t too_large = kinds.size() - 1;
  std::vector<void*> last(kinds.size(), nullptr);
  for (int generation = 0; generation < 3; ++generation) {  // both boards, then the first again
    std::vector<at::Tensor> shards, expected;
    for (size_t i = 0; i < kinds.size(); ++i) {
      shards.push_back(rank_values(kinds[i].first, 10 * generation + static_cast<int>(i), kinds[i].second));
      expected.push_back(at::zeros({w * kinds[i].first}, kinds[i].second));
      ring->all_gather(expected.back(), shards.back());
    }
    ASSERT_TRUE(publishing->publish_shards(shards));
    for (auto& shard : shards) shard.fill_(-1);  // the board holds copies: the shards may change now
    const std::string label = " (generation " + std::to_string(generation) + ")";
    rank0_first(*group, "published/" + std::to_string(generation), [&] {
      for (size_t i = 0; i < too_large; ++i) {
        void* board = publishing->published_unsharded(i);
        ASSERT_NE(board, nullptr) << "shard #" << i << " was not published" << label;
        // The gather is the board itself, laid out as all_gather's output: no copy.
        expect_bitwise(expected[i], at::from_blob(board, expected[i].sizes(), expected[i].options()),
                       "published unsharded buffer #" + std::to_string(i) + label);
        EXPECT_EQ(publishing->published_unsharded(i), board) << "a second gather of #" << i << " moved" << label;
        EXPECT_NE(board, last[i]) << "#" << i << " is where the last generation's is" << label;
        last[i] = board;
      }
    });
    EXPECT_EQ(publishing->published_unsharded(too_large), nullptr)
        << "the shard too large to publish has an unsharded buffer on the board" << label;
  }
}

TEST(DecoupledCollectives, PostedReduceScattersReturnBeforeThePeersPostAndSumAsTheRing) {
  const int w = dist().world->size();
  if (w == 1) GTEST_SKIP() << "a group of one reduces nothing";
  auto [group, shm, publishing, ring] = ShmAndRing("posted");
  ASSERT_TRUE(publishing);
  // The ring for postings is made at the first publication, sized by the published shards: 2 ×
  // (W - 1) × 20.5 KB here, so that each backward below wraps it and reuses the last one's room.
  const std::vector<at::Tensor> published = {at::zeros({1001}), at::zeros({4099})};
  ASSERT_TRUE(publishing->publish_shards(published));
  const std::vector<std::pair<int64_t, at::ScalarType>> kinds = {
      {1001, at::kFloat}, {1, at::kFloat}, {37, at::kBFloat16}, {2003, at::kFloat}, {999, at::kBFloat16}};
  for (int backward = 0; backward < 4; ++backward) {
    // Odd backwards divide the sums (as FSDP's mean does) in the completion's pass: bitwise the
    // ring's sum and then ATen's div_, by 3 (no power of two: a reciprocal would differ).
    const double divide_by = backward % 2 ? 3.0 : 1.0;
    std::vector<at::Tensor> grads, expected, out;
    for (size_t i = 0; i < kinds.size(); ++i) {
      grads.push_back(rank_values(w * kinds[i].first, 100 * backward + static_cast<int>(i), kinds[i].second));
      expected.push_back(at::empty({kinds[i].first}, kinds[i].second));
      ring->reduce_scatter_sum(expected.back(), grads.back().clone());
      if (divide_by != 1.0) expected.back().div_(divide_by);
      out.push_back(at::full({kinds[i].first}, std::numeric_limits<float>::quiet_NaN(), kinds[i].second));
    }
    std::vector<std::function<void()>> completions(kinds.size());
    rank0_first(*group, "posted/" + std::to_string(backward), [&] {
      for (size_t i = 0; i < kinds.size(); ++i) {
        at::Tensor full = grads[i].clone();
        completions[i] = publishing->reduce_scatter_sum_posted(out[i], full, divide_by);
        EXPECT_TRUE(completions[i]) << "reduce-scatter #" << i << " ran at once instead of being posted";
        full.fill_(std::numeric_limits<float>::quiet_NaN());  // free to reuse once posted
      }
    });
    // Completing a later one completes the earlier ones first (in posting order).
    if (completions[2]) completions[2]();
    for (size_t i = 0; i < kinds.size(); ++i) {
      if (completions[i]) completions[i]();
      expect_bitwise(expected[i], out[i], "posted reduce_scatter_sum #" + std::to_string(i) +
                                              " in backward " + std::to_string(backward));
    }
    publishing->complete_posted();
  }
  // One larger than the ring runs at once, in rounds (and is divided at once).
  const at::Tensor large = rank_values(w * 20000, 7, at::kFloat);
  at::Tensor expected = at::empty({20000}), out = at::empty({20000});
  ring->reduce_scatter_sum(expected, large.clone());
  expected.div_(3.0);
  EXPECT_FALSE(publishing->reduce_scatter_sum_posted(out, large.clone(), 3.0));
  expect_bitwise(expected, out, "reduce_scatter_sum larger than the ring");
}

torch::Tensor mse(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).pow(2).mean(); }

template <class Model>
void expect_same_parameters(Model& a, Model& b, const std::string& when) {
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    expect_bitwise(pb[item.key()], item.value(), item.key() + " " + when);
  }
}

TEST(DecoupledCollectives, TrainingThroughThemIsTheRingsBitwise) {
  fsdp::ProcessGroup& world = *dist().world;
  fsdp::GroupSettings ring_settings;
  ring_settings.cpu_collectives = fsdp::CpuCollectives::Ring;
  auto ring_group = group_with("decoupled_training_ring", ring_settings, world.timeout());
  auto decoupled = fsdp::fully_shard(make_odd_net(5), world);
  auto ring = fsdp::fully_shard(make_odd_net(5), *ring_group);
  torch::optim::Adam opt_decoupled(decoupled->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam opt_ring(ring->parameters(), torch::optim::AdamOptions(1e-2));
  const size_t segments_before = mapped_segments();
  for (int step = 0; step < 6; ++step) {
    const auto [x, y] = odd_batch(step, 8);
    const std::string when = "after step " + std::to_string(step);
    for (auto* pair : {&decoupled, &ring}) {
      auto& model = *pair;  // the sharded model: calling it runs the root's hooks
      torch::optim::Adam& opt = pair == &decoupled ? opt_decoupled : opt_ring;
      opt.zero_grad();
      const fsdp::NamedTensors full = step == 4 ? fsdp::gather_full_params(model) : fsdp::NamedTensors{};
      torch::Tensor loss = mse(model(x), y);
      if (step == 3) loss = loss + mse(model(x * 0.5), y);  // two forwards, one backward
      if (step == 4) {  // a load between a forward and its backward, which gathers the loaded values
        fsdp::NamedTensors halved;
        for (const auto& [name, value] : full) halved.emplace_back(name, value * 0.5);
        fsdp::load_full_params(model, halved, "halved");
      }
      loss.backward();
      opt.step();
      if (step == 1) {  // an evaluation forward between steps, under grad mode
        model->eval();
        model(x);
        model->train();
      }
      if (step == 1 || step == 2) {  // the shards change without a step
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.mul_(0.75);
      }
      if (step == 5) {  // a forward whose backward never comes, then an edit
        model(x);
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.add_(0.125);
      }
    }
    if (step == 0 && world.size() > 1) {
      EXPECT_EQ(mapped_segments(), segments_before + 2)
          << "the first forward should have mapped the board of published shards and the ring of posted sums";
    }
    expect_same_parameters(decoupled, ring, when);
    // A unit called alone, inside the root (outside it is refused: [Note: the root is not
    // skipped]), gathers the shards as they are now.
    auto first_alone = [](OddNetImpl& net, const torch::Tensor& in) { return net.first_unit(in); };
    expect_bitwise(ring.call(first_alone, x), decoupled.call(first_alone, x), "a unit called alone " + when);
  }
}

// A published unit computes on the board's bytes (its gathers copy nothing), while the root, whose
// unsharded parameters the program sees after forward, has a copy of its own; a unit left
// unsharded by a failed forward is gathered again from the next publication, never computing on
// a board the peers may be overwriting.
TEST(DecoupledCollectives, PublishedUnitsComputeOnTheBoardAndTheRootOnItsOwnCopy) {
  fsdp::ProcessGroup& world = *dist().world;
  if (world.size() == 1) GTEST_SKIP() << "a group of one publishes nothing";
  torch::manual_seed(3);
  auto model = fsdp::fully_shard(WhereNet(), world);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor x = torch::randn({4, 16});
  std::vector<const void*> boards;
  for (int step = 0; step < 4; ++step) {
    const std::string when = " in step " + std::to_string(step);
    if (step == 2) {  // a forward that fails inside the unit, and the program goes on
      model->inner->fail = true;
      EXPECT_THROW(model(x), c10::Error);
      model->inner->fail = false;
      ASSERT_TRUE(in_shared_segment(model->inner->seen)) << "the failed forward's unit" << when;
      boards.push_back(model->inner->seen);
    }
    opt.zero_grad();
    torch::Tensor loss = model(x).square().mean();
    EXPECT_TRUE(in_shared_segment(model->inner->seen)) << "the published unit computed on a copy" << when;
    EXPECT_FALSE(in_shared_segment(model->head->weight.data_ptr()))
        << "the root's unsharded parameters, which the program sees, are the board's" << when;
    if (!boards.empty()) {
      EXPECT_NE(model->inner->seen, boards.back()) << "the unit computed on the last publication's board" << when;
    }
    boards.push_back(model->inner->seen);
    loss.backward();
    opt.step();
  }
}

}  // namespace
}  // namespace fsdp_test
