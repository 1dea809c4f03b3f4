#pragma once
/// Joining the other ranks: torchrun's environment contract, the rendezvous, the process group.

#include <fsdp/launch_env.h>

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

class Collectives;  // the library's collectives (src/comm/collectives.h)

/// How the collectives of CPU tensors run. Every rank of a job must choose the same.
enum class CpuCollectives {
  /// Through a shared-memory segment when every rank of a group is on one host (one copy in and
  /// one out per byte; the same results and byte counts as the ring), else Ring.
  SharedMemory,
  /// Rings over Gloo's send/recv, also across hosts.
  Ring,
};

/// How the collectives of CUDA tensors run. Every rank of a job must choose the same.
enum class CudaCollectives {
  Nccl,    ///< NCCL's own
  Staged,  ///< rings over Gloo through pinned host buffers: for ranks that share a GPU
};

/// What the members of a process group agreed on when the job started; subgroups inherit it.
struct GroupSettings {
  CpuCollectives cpu_collectives = CpuCollectives::SharedMemory;
  CudaCollectives cuda_collectives = CudaCollectives::Nccl;
  /// The network interface Gloo listens on (GLOO_SOCKET_IFNAME); empty: the one that reaches the
  /// master's address.
  std::string socket_interface;
  /// The ranks of one host (LOCAL_WORLD_SIZE), the hybrid strategies' default shard group size;
  /// unset: unknown (the whole world).
  std::optional<int> local_world_size;
};

struct InitOptions {
  /// How long a collective or a rendezvous waits for a peer before it fails (never a hang).
  /// The environment variable FSDP_TIMEOUT_SECONDS overrides it.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  /// Give each rank cores / LOCAL_WORLD_SIZE intra-op threads, so local ranks do not thrash
  /// (unless OMP_NUM_THREADS is set).
  TORCH_ARG(bool, set_threads) = true;
  /// Unset: FSDP_CPU_COLLECTIVES ("shm" or "ring"), else shared memory.
  TORCH_ARG(std::optional<CpuCollectives>, cpu_collectives) = std::nullopt;
  /// Unset: FSDP_CUDA_COLLECTIVES ("nccl" or "staged"), else NCCL.
  TORCH_ARG(std::optional<CudaCollectives>, cuda_collectives) = std::nullopt;
};

/// A set of ranks that communicate through one c10d backend (Gloo on CPU), plus a store for
/// small out-of-band exchanges (model descriptions) that also time out.
class ProcessGroup {
 public:
  ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, c10::intrusive_ptr<c10d::Store> store,
               int rank, int size, std::chrono::milliseconds timeout, std::string name,
               std::string hostname, GroupSettings settings = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  c10d::Backend& backend() const { return *backend_; }
  c10d::Store& store() const { return *store_; }
  const GroupSettings& settings() const { return settings_; }
  /// A subgroup's own facts, e.g. how many of its members share a host (DeviceMesh).
  void set_settings(GroupSettings settings) { settings_ = std::move(settings); }
  /// The host name of each rank of this group (gethostname(), exchanged at start-up).
  const std::vector<std::string>& hosts() const { return hosts_; }
  void set_hosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }
  /// "rank 3 on node7": member `group_rank` by its world rank (and host, when known).
  std::string describe_member(int group_rank) const;
  /// A fresh key prefix for one exchange through the store (same sequence on every rank).
  std::string next_store_key(const std::string& what);
  /// A new group of `ranks` (ranks of this group, ascending; this rank among them). Only its
  /// members call it, all with the same `ranks` and `name`.
  std::shared_ptr<ProcessGroup> subgroup(const std::vector<int>& ranks, const std::string& name);
  /// Where this group's own all_reduce_sum and broadcast run, once the first of them has made it
  /// (src/comm/collectives.cpp): shared memory where every member is on this host, else Gloo.
  std::shared_ptr<Collectives>& own_collectives() { return own_collectives_; }

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  std::string hostname_;  // picks the network device of subgroups
  GroupSettings settings_;
  std::vector<std::string> hosts_;
  std::vector<int> world_ranks_;  // of each member
  int64_t store_sequence_ = 0;
  std::shared_ptr<Collectives> own_collectives_;
};

/// This process's place in the job: the launch environment and the world process group.
struct Distributed {
  LaunchEnv env;
  std::shared_ptr<ProcessGroup> world;
  /// The rendezvous store itself (no prefix): init_replicas keeps its quorum there.
  c10::intrusive_ptr<c10d::Store> store;
  int rank() const { return env.rank; }
  int world_size() const { return env.world_size; }
};

/// Joins the job described by the environment (LaunchEnv): TCPStore rendezvous on
/// MASTER_ADDR:MASTER_PORT (rank 0 serves it, or torchrun's elastic agent does), the ranks'
/// host names exchanged, then a Gloo process group over all ranks. The library's environment
/// variables (FSDP_TIMEOUT_SECONDS, FSDP_CPU_COLLECTIVES, FSDP_CUDA_COLLECTIVES, OMP_NUM_THREADS,
/// GLOO_SOCKET_IFNAME) are read here, once.
///
/// Example:
///   auto dist = fsdp::init_distributed();
///   std::cout << "rank " << dist->rank() << " of " << dist->world_size() << "\n";
std::shared_ptr<Distributed> init_distributed(InitOptions options = {});

}  // namespace fsdp

namespace fsdp {

/// t <- the sum of t over the ranks of `group` (counted in comm_stats().all_reduce_bytes); the
/// result is Gloo's, bitwise. A group whose members are all on this host runs it (and broadcast)
/// through a shared-memory segment of its own, joined at the first call; others through Gloo.
void all_reduce_sum(ProcessGroup& group, const at::Tensor& t);
/// t <- rank `root`'s t (counted in comm_stats().broadcast_bytes).
void broadcast(ProcessGroup& group, const at::Tensor& t, int root);

}  // namespace fsdp
