#pragma once
// [Note: settings from the environment]
// The library's switches that a launcher or a user may set as environment variables are read
// here and nowhere else, once, when the job joins (init_distributed), then passed down as values:
// the timeout and thread count to the rendezvous, the choice of collectives and Gloo's network
// interface to the process groups (InitOptions can set the collectives instead). A malformed value
// fails there, naming the variable and what it must hold. The launcher's own variables (RANK,
// LOCAL_WORLD_SIZE, ...) are LaunchEnv's.

#include <fsdp/distributed.h>

#include <chrono>
#include <optional>
#include <string>

namespace fsdp {

struct EnvironmentSettings {
  /// OMP_NUM_THREADS is set: the user (or fsdprun) chose the threads per rank.
  bool threads_chosen = false;
  /// FSDP_TIMEOUT_SECONDS: overrides InitOptions::timeout.
  std::optional<std::chrono::milliseconds> timeout;
  /// FSDP_CPU_COLLECTIVES ("shm" or "ring") and FSDP_CUDA_COLLECTIVES ("nccl" or "staged").
  std::optional<CpuCollectives> cpu_collectives;
  std::optional<CudaCollectives> cuda_collectives;
  /// GLOO_SOCKET_IFNAME (Gloo's own, as in PyTorch): the network interface Gloo uses.
  std::string gloo_socket_ifname;
  /// LOCAL_WORLD_SIZE (0 when not a number; unset: nullopt): the ranks of one host, the hybrid
  /// strategies' default shard group size.
  std::optional<int> local_world_size;

  /// Reads every variable above through `lookup`; a malformed one throws naming it.
  static EnvironmentSettings from(const EnvLookup& lookup);
  static EnvironmentSettings from_environment();
};

}  // namespace fsdp
