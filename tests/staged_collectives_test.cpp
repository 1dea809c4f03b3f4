// Staged collectives (src/comm/staged_collectives.cpp: device tensors through host buffers, run by the
// rings; what lets ranks that share a GPU run the CUDA path) give bitwise the rings' own results,
// with real ranks over real Gloo. On CPU the staging copies are plain host copies: the logic of
// copying out, running and copying back, and the chunk offsets, are what is checked here.
#include "collective_testing.h"
#include "dist_env.h"

#include "comm/collectives.h"
#include "comm/host_collectives.h"

#include <fsdp/comm_stats.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace fsdp_test {
namespace {

TEST(StagedCollectives, GiveTheRingsResultsBitwise) {
  fsdp::ProcessGroup& world = *dist().world;
  auto ring = fsdp::make_ring_collectives(world);
  auto staged = fsdp::make_staged_collectives(fsdp::make_ring_collectives(world));
  const int w = world.size();
  const int64_t s = 37;

  at::Tensor full_ring = at::zeros({w * s}), full_staged = at::zeros({w * s});
  at::Tensor shard = rank_values(s, 1);
  ring->all_gather(full_ring, shard);
  staged->all_gather(full_staged, shard);
  EXPECT_TRUE(at::equal(full_ring, full_staged));
  EXPECT_TRUE(at::equal(full_staged.narrow(0, world.rank() * s, s), shard));

  at::Tensor grads = rank_values(w * s, 2);
  at::Tensor ring_scratch = grads.clone(), staged_input = grads.clone();
  at::Tensor out_ring = at::empty({s}), out_staged = at::empty({s});
  ring->reduce_scatter_sum(out_ring, ring_scratch);
  staged->reduce_scatter_sum(out_staged, staged_input);
  EXPECT_TRUE(at::equal(out_ring, out_staged));
  EXPECT_TRUE(at::equal(staged_input, grads)) << "staging must not change the caller's input";

  at::Tensor sum_ring = rank_values(11, 3), sum_staged = sum_ring.clone();
  ring->all_reduce_sum(sum_ring);
  staged->all_reduce_sum(sum_staged);
  EXPECT_TRUE(at::equal(sum_ring, sum_staged));

  at::Tensor from_root = rank_values(5, 4);
  const at::Tensor expected = from_root.clone();
  fsdp::broadcast(world, expected, /*root=*/w - 1);
  staged->broadcast(from_root, /*root=*/w - 1);
  EXPECT_TRUE(at::equal(from_root, expected));
}

// Element k of what rank `from` sends to rank `to`: a value only that pair and place give.
float sent_value(int from, int to, int64_t k) { return static_cast<float>(1000 * from + 100 * to + k); }

// Rank `from` sends rank `to` (from + 2 * to) % 3 + 1 elements: uneven, some pairs more than others.
int64_t count_between(int from, int to) { return (from + 2 * to) % 3 + 1; }

// Every implementation of the device seam's all_to_all on the host (the ring's, shared memory's,
// staged through host copies) puts what each member sent this rank, in member order, and counts
// what left for the others (Muon's exchanges run on it).
// What each member sends each other: counts(from, to) elements, sent_value's values.
struct AllToAllCase {
  std::vector<int64_t> send_numels, receive_numels;
  at::Tensor send, expected;
  int64_t to_others = 0;
};
AllToAllCase all_to_all_case(int w, int me, const std::function<int64_t(int, int)>& counts) {
  AllToAllCase c;
  std::vector<float> send_values, expected_values;
  for (int r = 0; r < w; ++r) {
    c.send_numels.push_back(counts(me, r));
    c.receive_numels.push_back(counts(r, me));
    for (int64_t k = 0; k < counts(me, r); ++k) send_values.push_back(sent_value(me, r, k));
    for (int64_t k = 0; k < counts(r, me); ++k) expected_values.push_back(sent_value(r, me, k));
    c.to_others += r == me ? 0 : counts(me, r);
  }
  c.send = at::tensor(send_values);
  c.expected = at::tensor(expected_values);
  return c;
}

TEST(Collectives, AllToAllDeliversEachMembersPartInOrder) {
  fsdp::ProcessGroup& world = *dist().world;
  const AllToAllCase c = all_to_all_case(world.size(), world.rank(), count_between);
  const auto& [send_numels, receive_numels, send, expected, to_others] = c;
  std::vector<std::pair<const char*, std::unique_ptr<fsdp::Collectives>>> implementations;
  implementations.emplace_back("ring", fsdp::make_ring_collectives(world));
  implementations.emplace_back("host (shared memory on one host)", fsdp::host_collectives(world, 1 << 16));
  implementations.emplace_back("staged", fsdp::make_staged_collectives(fsdp::make_ring_collectives(world)));
  for (auto& [name, collectives] : implementations) {
    at::Tensor received = at::full({expected.numel()}, -1.0f);
    const int64_t before = fsdp::comm_stats().all_to_all_bytes;
    collectives->all_to_all(received, send, send_numels, receive_numels);
    expect_bitwise(expected, received, name);
    EXPECT_EQ(fsdp::comm_stats().all_to_all_bytes - before, 4 * to_others) << name;
  }
}

// Through shared memory with the smallest slots (a page, split among the peers): one message of
// several rounds' worth, the others of one round or none, so that every rank runs the rounds the
// largest message of any pair needs, also with nothing left to send.
TEST(Collectives, AllToAllThroughSharedMemoryRunsTheRoundsOfTheLargestMessage) {
  fsdp::ProcessGroup& world = *dist().world;
  const int w = world.size();
  auto counts = [w](int from, int to) -> int64_t { return from == w - 1 && to == 0 ? 1500 : (from + to) % 2 * 37; };
  const AllToAllCase c = all_to_all_case(w, world.rank(), counts);
  auto collectives = fsdp::host_collectives(world, 256);
  for (int repeat = 0; repeat < 2; ++repeat) {  // the rounds stay in step across calls
    at::Tensor received = at::full({c.expected.numel()}, -1.0f);
    const int64_t before = fsdp::comm_stats().all_to_all_bytes;
    collectives->all_to_all(received, c.send, c.send_numels, c.receive_numels);
    expect_bitwise(c.expected, received, "shared memory, small slots");
    EXPECT_EQ(fsdp::comm_stats().all_to_all_bytes - before, 4 * c.to_others);
  }
}

}  // namespace
}  // namespace fsdp_test
