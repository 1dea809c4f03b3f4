// Staged collectives (src/comm/staged_collectives.cpp: device tensors through host buffers, run by the
// rings; what lets ranks that share a GPU run the CUDA path) give bitwise the rings' own results,
// with real ranks over real Gloo. On CPU the staging copies are plain host copies: the logic of
// copying out, running and copying back, and the chunk offsets, are what is checked here.
#include "collective_testing.h"
#include "dist_env.h"

#include "comm/collectives.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fsdp_test
