#pragma once
/// Joining the other ranks: torchrun's environment contract, the rendezvous, the process group.

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

/// The variables torchrun (and fsdprun) set for every rank.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  /// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. A missing,
  /// malformed or inconsistent variable throws with its name and what it should hold.
  static LaunchEnv from_environment();
};

struct InitOptions {
  /// How long a collective or a rendezvous waits for a peer before it fails (never a hang).
  /// The environment variable FSDP_TIMEOUT_SECONDS overrides it.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  /// Give each rank cores / LOCAL_WORLD_SIZE intra-op threads, so local ranks do not thrash.
  TORCH_ARG(bool, set_threads) = true;
};

/// A set of ranks that communicate through one c10d backend (Gloo on CPU), plus a store for
/// small out-of-band exchanges (model descriptions) that also time out.
class ProcessGroup {
 public:
  ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, c10::intrusive_ptr<c10d::Store> store,
               int rank, int size, std::chrono::milliseconds timeout, std::string name,
               std::string hostname);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  c10d::Backend& backend() const { return *backend_; }
  c10d::Store& store() const { return *store_; }
  /// A fresh key prefix for one exchange through the store (same sequence on every rank).
  std::string next_store_key(const std::string& what);
  /// A new group of `ranks` (ranks of this group, ascending; this rank among them). Only its
  /// members call it, all with the same `ranks` and `name`.
  std::shared_ptr<ProcessGroup> subgroup(const std::vector<int>& ranks, const std::string& name);

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  std::string hostname_;  // picks the network device of subgroups
  int64_t store_sequence_ = 0;
};

/// This process's place in the job: the launch environment and the world process group.
struct Distributed {
  LaunchEnv env;
  std::shared_ptr<ProcessGroup> world;
  int rank() const { return env.rank; }
  int world_size() const { return env.world_size; }
};

/// Joins the job described by the environment (torchrun contract): TCPStore rendezvous on
/// MASTER_ADDR:MASTER_PORT (rank 0 serves), then a Gloo process group over all ranks.
/// Also installs the memory counter (fsdp/memory.h).
///
/// Example:
///   auto dist = fsdp::init_distributed();
///   std::cout << "rank " << dist->rank() << " of " << dist->world_size() << "\n";
std::shared_ptr<Distributed> init_distributed(InitOptions options = {});

}  // namespace fsdp

namespace fsdp {

/// t <- the sum of t over the ranks of `group` (counted in comm_stats().all_reduce_bytes).
void all_reduce_sum(ProcessGroup& group, const at::Tensor& t);
/// t <- rank `root`'s t (counted in comm_stats().broadcast_bytes).
void broadcast(ProcessGroup& group, const at::Tensor& t, int root);

}  // namespace fsdp
