#pragma once
// A folder the ranks of a multi-rank test share: named alike on every rank (rank 0's pid), removed
// by rank 0 once every rank is done with it.
#include "dist_env.h"

#include <fsdp/fsdp.h>

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace fsdp_test {

/// "/tmp/fsdp-<test>-<rank 0's pid>-w<world>-<what>": a collective, every rank calls it.
inline std::string shared_folder(const std::string& test, const std::string& what) {
  auto pid = torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong);
  fsdp::broadcast(*dist().world, pid, 0);
  return "/tmp/fsdp-" + test + "-" + std::to_string(pid.item<int64_t>()) + "-w" +
         std::to_string(dist().world_size()) + "-" + what;
}

/// Returns once every rank has called it.
inline void barrier() {
  auto t = torch::zeros({1});
  fsdp::all_reduce_sum(*dist().world, t);
}

/// Once every rank is done with `folder`, rank 0 removes it.
inline void remove_shared(const std::string& folder) {
  barrier();
  if (dist().rank() == 0) std::filesystem::remove_all(folder);
}

}  // namespace fsdp_test
