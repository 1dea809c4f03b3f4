#pragma once
// Process groups for the multi-rank tests, beside the world of dist_env.h.

#include "dist_env.h"

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

}  // namespace fsdp_test
