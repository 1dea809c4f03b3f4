#pragma once
// What the multi-rank tests of collectives share: groups beside the world of dist_env.h, values
// that differ on every rank, and a bitwise comparison that says where it fails.

#include "dist_env.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace fsdp_test {

/// A group of the world's ranks, backend and host names, with its own `settings` and `timeout`
/// and a store of its own (the world's, its keys under `name`).
inline std::shared_ptr<fsdp::ProcessGroup> group_with(const std::string& name, fsdp::GroupSettings settings,
                                                      std::chrono::milliseconds timeout) {
  fsdp::ProcessGroup& world = *dist().world;
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      name, c10::intrusive_ptr<c10d::Store>::reclaim_copy(&world.store()));
  auto group = std::make_shared<fsdp::ProcessGroup>(
      c10::intrusive_ptr<c10d::Backend>::reclaim_copy(&world.backend()), store, world.rank(),
      world.size(), timeout, name, "127.0.0.1", settings);
  group->set_hosts(world.hosts());
  return group;
}

/// Different values on every rank, the same on every run; magnitudes spread over a few decades so
/// that a sum in another order changes bits.
inline at::Tensor rank_values(int64_t numel, int salt, at::ScalarType dtype = at::kFloat) {
  at::Generator generator = at::detail::createCPUGenerator(1000 * dist().rank() + salt);
  at::Tensor spread = at::exp(at::randn({numel}, generator) * 3);
  return (at::randn({numel}, generator) * spread).to(dtype);
}

/// A bitwise comparison with the ring's (or the reference's) result that says where the first
/// difference is.
inline void expect_bitwise(const at::Tensor& expected, const at::Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.sizes(), actual.sizes()) << what;
  const at::Tensor same = at::eq(expected.reshape({-1}).view(at::kByte), actual.reshape({-1}).view(at::kByte));
  if (same.all().item<bool>()) return;
  const int64_t byte = at::argmin(same.to(at::kInt)).item<int64_t>();
  ADD_FAILURE() << what << " on rank " << dist().rank() << ": differs from the ring first at element "
                << byte / expected.element_size() << " of " << expected.numel();
}

}  // namespace fsdp_test
