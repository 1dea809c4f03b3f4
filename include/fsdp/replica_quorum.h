#pragma once
/// Replicas that survive a lost peer (HSDP, fault-tolerant): the world split into replicas of
/// `shard_group_size` consecutive ranks, each replica a world of its own (FULL_SHARD inside it),
/// and the replicas joined only by a quorum that averages their gradients each step. When a rank
/// dies, its replica is lost: the others finish the step over the replicas still alive and go on;
/// a replacement replica joins at a step boundary and receives the state from a live one over the
/// network. docs/fault-tolerance.md tells the protocol.
///
///   auto job = fsdp::init_replicas(/*shard_group_size=*/2);   // under fsdprun --fault-tolerant 2
///   auto model = fsdp::fully_shard(net, *job.dist->world);     // FULL_SHARD over one replica
///   if (job.quorum->joining()) state = job.quorum->join(tensors);  // a replacement
///   loss.backward();
///   job.quorum->average(grads);              // sum over the live replicas / their count
///   optimizer.step();
///   job.quorum->admit_replacements([&] { return state_of_this_rank(); });

#include <fsdp/distributed.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

/// Where this process sits among the replicas.
struct ReplicaLayout {
  int replica = 0;           ///< RANK / shard_group_size
  int replicas = 1;          ///< WORLD_SIZE / shard_group_size
  int shard = 0;             ///< RANK % shard_group_size: the rank inside its replica
  int shard_group_size = 1;
  /// FSDP_REPLICA_INCARNATION (fsdprun sets it): 0 for the replica's first start, k for its k-th
  /// replacement, which joins the running replicas instead of starting training.
  int incarnation = 0;
  int global_rank() const { return replica * shard_group_size + shard; }
};

/// This replica is no longer in the quorum (a rank of it died, or it came too late): the process
/// exits (kReplicaLostExit) so that the launcher replaces its replica while the others go on.
class ReplicaLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The exit status of a rank whose replica was lost (fsdprun --fault-tolerant restarts the
/// replica's processes on any failure; the status tells the cause in its summary).
constexpr int kReplicaLostExit = 75;

/// What one step's average used.
struct ReplicaStep {
  int replicas_alive = 1;   ///< the replicas whose gradients the average holds
  double batch_share = 1;   ///< this replica's share of the step's global batch (1 / alive)
};

/// What a live replica hands a replacement: tensors received in place (the parameters' shards)
/// and bytes (the optimizer's state, the step to continue from: whatever the program keeps).
struct ReplicaState {
  std::vector<at::Tensor> tensors;
  std::string bytes;
};

class ReplicaQuorum {
 public:
  /// `store` outlives every rank (a prefix of it per launch attempt); `vote_timeout` is how long
  /// a step waits for the other replicas' votes before it counts the silent ones as lost;
  /// `group_timeout` bounds each collective between replicas.
  ReplicaQuorum(c10::intrusive_ptr<c10d::Store> store, ReplicaLayout layout,
                std::chrono::milliseconds vote_timeout, std::chrono::milliseconds group_timeout,
                std::string master_addr, std::string socket_interface);
  ~ReplicaQuorum();
  ReplicaQuorum(const ReplicaQuorum&) = delete;
  ReplicaQuorum& operator=(const ReplicaQuorum&) = delete;

  const ReplicaLayout& layout() const { return layout_; }
  /// A replacement that has not received the state yet: call join() before training.
  bool joining() const { return layout_.incarnation > 0 && !joined_; }
  /// The live replicas of the current quorum, ascending.
  const std::vector<int>& live() const { return live_; }
  /// Whether this replica is the lowest live one (e.g. the one that writes checkpoints).
  bool leads() const { return !live_.empty() && live_.front() == layout_.replica; }

  /// In place: the sum of `tensors` over the live replicas' ranks of this shard index, divided
  /// by their count. A replica lost before or during the reduction is dropped and the step's
  /// reduction redone over the survivors from the original values. Throws ReplicaLost when this
  /// replica is the one dropped. Every live rank calls it once per step.
  ReplicaStep average(const std::vector<at::Tensor>& tensors);

  /// Whether the last step's quorum admitted replacements (admit_replacements has work).
  bool admitting() const { return !admitted_.empty(); }

  /// After a step's optimizer step: admits the replacements the step's quorum let in; the lowest
  /// live replica sends them `state()` (called only then). Returns how many replicas joined.
  int admit_replacements(const std::function<ReplicaState()>& state);

  /// A replacement: registers, waits until the live replicas admit it at a step boundary, then
  /// receives the state: `tensors` in place, the sender's bytes returned. nullopt when the run
  /// finished before it could join.
  std::optional<std::string> join(const std::vector<at::Tensor>& tensors);

  /// A collective over this replica's own ranks (e.g. an all-reduce of a scalar over
  /// Replicas::dist->world) that a replacement runs after receiving the state, before it votes:
  /// a rank of it that died meanwhile is found there and the quorum told at once.
  void set_replica_check(std::function<void()> check) { replica_check_ = std::move(check); }

  /// Tests: called on a replacement after each tensor it receives (its index), e.g. to die there.
  void on_tensor_received(std::function<void(size_t)> hook) { on_tensor_received_ = std::move(hook); }

  /// This replica gives up (its shard group failed): the quorum stops waiting for its votes.
  void mark_lost();
  /// After the last step: a replacement that still waits to join exits instead.
  void finish();

 private:
  struct Decision;
  Decision vote_and_decide(bool ok);
  Decision decide(int64_t round);
  Decision read_decision(int64_t round);
  std::string propose(int64_t round);
  bool all_answered(int64_t round);
  std::vector<std::pair<int, int>> waiting_replacements();  // (replica, incarnation)
  void reconfigure(const std::vector<int>& live, int epoch);
  void send_or_receive(ReplicaState& state, int source_replica);
  int rank_in_group(int replica) const;
  void check_own_replica();

  c10::intrusive_ptr<c10d::Store> store_;
  ReplicaLayout layout_;
  std::chrono::milliseconds vote_timeout_, group_timeout_;
  std::string master_addr_, socket_interface_;
  std::vector<int> live_;
  int epoch_ = 0;
  int64_t round_ = 0;
  c10::intrusive_ptr<c10d::Backend> group_;  // this shard index's ranks of the live replicas
  bool group_broken_ = false;                // it did not form: the round votes it failed
  std::vector<int> admitted_;                // replacements the last commit let in
  int admitted_epoch_ = 0;
  bool joined_ = false;
  std::function<void(size_t)> on_tensor_received_;
  std::function<void()> replica_check_;
};

/// A job of replicas: this replica's ranks as the world, and the quorum between replicas.
struct Replicas {
  std::shared_ptr<Distributed> dist;  ///< world: this replica's shard_group_size ranks
  std::unique_ptr<ReplicaQuorum> quorum;
};

/// Joins the job as fault-tolerant replicas of `shard_group_size` consecutive ranks. Needs a
/// store that outlives every rank (fsdprun --fault-tolerant serves it from a process of its own;
/// TORCHELASTIC_USE_AGENT_STORE=True) and at least two replicas; refuses otherwise, by name.
Replicas init_replicas(int shard_group_size, InitOptions options = {},
                       std::chrono::milliseconds vote_timeout = std::chrono::seconds(10));

}  // namespace fsdp
