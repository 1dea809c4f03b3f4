#include <fsdp/replica_quorum.h>

#include <fsdp/error_text.h>

#include "launch/gloo_backend.h"
#include "launch/join_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace fsdp {

// [Note: the quorum's rounds] (docs/fault-tolerance.md)
// Every step ends with a round n: each live rank votes "vote/n/RANK" (1: its reduction worked),
// then the first rank to see every vote, or to wait vote_timeout for them, writes "decision/n"
// (compare-and-set: one decision per round, read by all). A replica is alive when all its ranks
// voted and none marked it lost. Commit: all voted 1, the step's average stands (and waiting
// replacements are let in). Else the next epoch's quorum is the replicas alive, and the step's
// reduction runs again over them. Replacements read "latest" to find the round that admits them.
struct ReplicaQuorum::Decision {
  bool commit = false;
  int epoch = 0;                // the quorum's epoch after this round
  std::vector<int> live;        // its replicas (a commit: the round's own)
  std::vector<int> joiners;     // a commit: replacements admitted for the next epoch
  std::vector<int> incarnations;  // theirs, in the same order

  bool admits(const ReplicaLayout& layout) const {
    for (size_t i = 0; i < joiners.size(); ++i) {
      if (joiners[i] == layout.replica && incarnations.at(i) == layout.incarnation) return true;
    }
    return false;
  }
};

namespace {

std::string list_text(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

bool contains(const std::vector<int>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

void pause_briefly() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }

std::string vote_key(int64_t round, int rank) {
  return "vote/" + std::to_string(round) + "/" + std::to_string(rank);
}
std::string decision_key(int64_t round) { return "decision/" + std::to_string(round); }
std::string join_key(int replica, int shard) {
  return "join/" + std::to_string(replica) + "/" + std::to_string(shard);
}
std::string lost_key(int replica) { return "lost/" + std::to_string(replica); }

std::vector<int> all_replicas(int n) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r) out.push_back(r);
  return out;
}

// Host memory in fp32 holding every tensor, end to end (one collective per step).
at::Tensor flat_copy(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().reshape(-1).to(at::kCPU, at::kFloat));
  if (parts.empty()) return at::zeros({0}, at::kFloat);
  return at::cat(parts);
}

void copy_back(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(flat.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

}  // namespace

ReplicaQuorum::ReplicaQuorum(c10::intrusive_ptr<c10d::Store> store, ReplicaLayout layout,
                             std::chrono::milliseconds vote_timeout,
                             std::chrono::milliseconds group_timeout, std::string master_addr,
                             std::string socket_interface)
    : store_(std::move(store)),
      layout_(layout),
      vote_timeout_(vote_timeout),
      group_timeout_(group_timeout),
      master_addr_(std::move(master_addr)),
      socket_interface_(std::move(socket_interface)) {
  TORCH_CHECK(layout_.replicas >= 2, "fsdp::ReplicaQuorum: ", layout_.replicas,
              " replica has none to survive its loss; fault tolerance needs at least 2 replicas "
              "(WORLD_SIZE / shard_group_size >= 2)");
  // The first start forms the quorum of every replica; a replacement waits in join().
  if (layout_.incarnation == 0) reconfigure(all_replicas(layout_.replicas), 0);
}

ReplicaQuorum::~ReplicaQuorum() = default;

int ReplicaQuorum::rank_in_group(int replica) const {
  return static_cast<int>(std::find(live_.begin(), live_.end(), replica) - live_.begin());
}

// A Gloo group per (epoch, shard index) over the live replicas' ranks; alone, none.
void ReplicaQuorum::reconfigure(const std::vector<int>& live, int epoch) {
  live_ = live;
  epoch_ = epoch;
  group_.reset();
  group_broken_ = false;
  if (live_.size() < 2) return;
  auto prefix = c10::make_intrusive<c10d::PrefixStore>(
      "group/" + std::to_string(epoch) + "/s" + std::to_string(layout_.shard), store_);
  try {
    group_ = make_gloo_backend(prefix, rank_in_group(layout_.replica),
                               static_cast<int>(live_.size()), group_timeout_, master_addr_,
                               socket_interface_);
  } catch (const std::exception&) {
    group_broken_ = true;  // a member died after the vote: the next round drops it
  }
}

std::vector<std::pair<int, int>> ReplicaQuorum::waiting_replacements() {
  std::vector<std::pair<int, int>> ready;
  for (int r = 0; r < layout_.replicas; ++r) {
    if (contains(live_, r)) continue;
    std::vector<std::string> keys;
    for (int s = 0; s < layout_.shard_group_size; ++s) keys.push_back(join_key(r, s));
    if (!store_->check(keys)) continue;
    // Each rank of it names its incarnation: all must be the same one (a late rank of an older
    // one is not a replacement).
    std::set<std::string> incarnations;
    for (const auto& key : keys) incarnations.insert(text_of(store_->get(key)));
    if (incarnations.size() == 1) ready.push_back({r, std::stoi(*incarnations.begin())});
  }
  return ready;
}

// Whether every live replica has either voted with all its ranks or marked itself lost.
bool ReplicaQuorum::all_answered(int64_t round) {
  for (int r : live_) {
    if (store_->check({lost_key(r)})) continue;
    for (int s = 0; s < layout_.shard_group_size; ++s) {
      if (!store_->check({vote_key(round, r * layout_.shard_group_size + s)})) return false;
    }
  }
  return true;
}

// This rank's proposal for round `round`, from the votes in the store now.
std::string ReplicaQuorum::propose(int64_t round) {
  std::vector<int> alive;
  bool all_ok = true;
  for (int r : live_) {
    bool complete = !store_->check({lost_key(r)});
    for (int s = 0; s < layout_.shard_group_size && complete; ++s) {
      const std::string key = vote_key(round, r * layout_.shard_group_size + s);
      complete = store_->check({key});
      if (complete) all_ok = all_ok && text_of(store_->get(key)) == "1";
    }
    if (complete) alive.push_back(r);
    all_ok = all_ok && complete;
  }
  const bool commit = all_ok && alive == live_;
  std::vector<int> joiners, incarnations;
  if (commit) {
    for (const auto& [replica, incarnation] : waiting_replacements()) {
      joiners.push_back(replica);
      incarnations.push_back(incarnation);
    }
  }
  const int epoch = commit ? epoch_ : epoch_ + 1;
  return std::string(commit ? "1" : "0") + "|" + std::to_string(epoch) + "|" +
         list_text(commit ? live_ : alive) + "|" + list_text(joiners) + "|" + list_text(incarnations);
}

ReplicaQuorum::Decision ReplicaQuorum::decide(int64_t round) {
  std::vector<std::string> votes;
  for (int r : live_) {
    for (int s = 0; s < layout_.shard_group_size; ++s) {
      votes.push_back(vote_key(round, r * layout_.shard_group_size + s));
    }
  }
  const std::string key = decision_key(round);
  const auto deadline = std::chrono::steady_clock::now() + vote_timeout_;
  // Until each replica has voted whole or marked itself lost, or the time is up.
  while (!store_->check({key}) && !store_->check(votes) && !all_answered(round) &&
         std::chrono::steady_clock::now() < deadline) {
    pause_briefly();
  }
  if (!store_->check({key})) {
    const std::string proposal = propose(round);
    const std::string stored = text_of(store_->compareSet(key, {}, bytes_of(proposal)));
    if (stored == proposal) {  // this proposal stands: its replacements are let in
      for (int r : read_decision(round).joiners) {
        for (int s = 0; s < layout_.shard_group_size; ++s) store_->deleteKey(join_key(r, s));
        store_->deleteKey(lost_key(r));
      }
    }
  }
  store_->set("latest", bytes_of(std::to_string(round)));
  return read_decision(round);
}

ReplicaQuorum::Decision ReplicaQuorum::read_decision(int64_t round) {
  const std::string text = text_of(store_->get(decision_key(round)));
  std::vector<std::string> fields;
  std::stringstream in(text);
  for (std::string field; std::getline(in, field, '|');) fields.push_back(field);
  fields.resize(5);
  Decision d;
  d.commit = fields[0] == "1";
  d.epoch = std::stoi(fields[1]);
  d.live = parse_list(fields[2]);
  d.joiners = parse_list(fields[3]);
  d.incarnations = parse_list(fields[4]);
  return d;
}

ReplicaQuorum::Decision ReplicaQuorum::vote_and_decide(bool ok) {
  const int64_t round = round_++;
  store_->set(vote_key(round, layout_.global_rank()), bytes_of(ok ? "1" : "0"));
  Decision d = decide(round);
  if (!contains(d.live, layout_.replica)) {
    throw ReplicaLost("replica " + std::to_string(layout_.replica) + " was dropped from the quorum "
                      "in round " + std::to_string(round) + " (live replicas: " +
                      list_text(d.live) + "): a rank of it failed or answered too late");
  }
  return d;
}

ReplicaStep ReplicaQuorum::average(const std::vector<at::Tensor>& tensors) {
  const at::Tensor original = flat_copy(tensors);
  for (int tries = 0;; ++tries) {
    at::Tensor flat = original.clone();
    bool ok = !group_broken_;
    if (group_) {
      try {
        std::vector<at::Tensor> io{flat};
        group_->allreduce(io)->wait();
      } catch (const std::exception&) {
        ok = false;  // a peer replica is gone: the round decides who is left
      }
    }
    const Decision d = vote_and_decide(ok);
    if (d.commit) {
      const int alive = static_cast<int>(live_.size());
      copy_back(flat.div_(alive), tensors);
      admitted_ = d.joiners;
      admitted_epoch_ = d.epoch + 1;
      return {alive, 1.0 / alive};
    }
    TORCH_CHECK(tries < 8, "fsdp::ReplicaQuorum: the replicas' reduction failed ", tries + 1,
                " times in a row with every replica answering; giving up");
    reconfigure(d.live, d.epoch);
  }
}

// The state from `source_replica`, the lowest live one: byte count, bytes, then each tensor.
void ReplicaQuorum::send_or_receive(ReplicaState& state, int source_replica) {
  TORCH_CHECK(group_ && !group_broken_, "the replicas' group did not form");
  c10d::BroadcastOptions options;
  options.rootRank = rank_in_group(source_replica);
  auto broadcast = [&](at::Tensor t) {
    std::vector<at::Tensor> io{t};
    group_->broadcast(io, options)->wait();
  };
  auto size = at::tensor({static_cast<int64_t>(state.bytes.size())}, at::kLong);
  broadcast(size);
  auto bytes = at::empty({size.item<int64_t>()}, at::kByte);
  if (layout_.replica == source_replica) {
    std::memcpy(bytes.data_ptr(), state.bytes.data(), state.bytes.size());
  }
  if (bytes.numel() > 0) broadcast(bytes);
  state.bytes.assign(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    const at::Tensor& t = state.tensors[i];
    if (t.numel() == 0) continue;
    auto host = t.detach().to(at::kCPU).contiguous().clone();
    broadcast(host);
    t.copy_(host);
    if (joining() && on_tensor_received_) on_tensor_received_(i);
  }
}

int ReplicaQuorum::admit_replacements(const std::function<ReplicaState()>& state) {
  if (admitted_.empty()) return 0;
  const std::vector<int> joiners = std::exchange(admitted_, {});
  std::vector<int> senders = live_;
  std::vector<int> next = live_;
  next.insert(next.end(), joiners.begin(), joiners.end());
  std::sort(next.begin(), next.end());
  reconfigure(next, admitted_epoch_);
  ReplicaState mine = state();
  for (int tries = 0;; ++tries) {
    bool ok = true;
    try {
      ReplicaState copy = mine;
      send_or_receive(copy, senders.front());
    } catch (const std::exception&) {
      ok = false;
    }
    const Decision d = vote_and_decide(ok);
    if (d.commit) return static_cast<int>(joiners.size());
    reconfigure(d.live, d.epoch);
    int still_joining = 0;
    for (int r : joiners) still_joining += contains(d.live, r) ? 1 : 0;
    if (still_joining == 0) return 0;  // the replacement was lost in the transfer: go on without it
    std::vector<int> left;
    for (int r : senders) {
      if (contains(d.live, r)) left.push_back(r);
    }
    senders = left;
    TORCH_CHECK(!senders.empty() && tries < 8, "fsdp::ReplicaQuorum: the state transfer to a "
                "replacement failed and no live replica is left to send it");
  }
}

std::optional<std::string> ReplicaQuorum::join(const std::vector<at::Tensor>& tensors) {
  store_->set(join_key(layout_.replica, layout_.shard), bytes_of(std::to_string(layout_.incarnation)));
  const auto deadline = std::chrono::steady_clock::now() + group_timeout_;
  // Live replicas end a round every step: rounds that stop coming mean none is left to send the
  // state (every replica lost a rank), and the launcher restarts the job from its checkpoint.
  const auto silence = 3 * vote_timeout_;
  auto last_news = std::chrono::steady_clock::now();
  int64_t last_round = -1;
  std::optional<Decision> admitting;
  int64_t round = -1;
  while (!admitting) {
    if (store_->check({"finished"})) return std::nullopt;
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "replica ", layout_.replica,
                ": no live replica admitted this replacement within ",
                group_timeout_.count() / 1000.0, " s (FSDP_TIMEOUT_SECONDS)");
    if (std::chrono::steady_clock::now() - last_news > silence) {
      throw ReplicaLost("replica " + std::to_string(layout_.replica) + " cannot join: no live "
                        "replica ended a step in " + std::to_string(silence.count() / 1000.0) +
                        " s (every replica lost a rank?)");
    }
    if (store_->check({"latest"})) {
      const int64_t latest = std::stoll(text_of(store_->get("latest")));
      if (latest != last_round) {
        last_round = latest;
        last_news = std::chrono::steady_clock::now();
      }
      for (int64_t r = std::max<int64_t>(0, latest - 1); r <= latest && !admitting; ++r) {
        if (!store_->check({decision_key(r)})) continue;
        Decision d = read_decision(r);
        if (d.commit && d.admits(layout_)) {
          admitting = d;
          round = r;
        }
      }
    }
    if (!admitting) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  round_ = round + 1;
  std::vector<int> senders = admitting->live;
  std::vector<int> next = admitting->live;
  next.insert(next.end(), admitting->joiners.begin(), admitting->joiners.end());
  std::sort(next.begin(), next.end());
  reconfigure(next, admitting->epoch + 1);
  ReplicaState received{tensors, {}};
  for (int tries = 0;; ++tries) {
    bool ok = true;
    try {
      send_or_receive(received, senders.front());
    } catch (const std::exception&) {
      ok = false;
    }
    check_own_replica();
    const Decision d = vote_and_decide(ok);
    if (d.commit) {
      joined_ = true;
      return received.bytes;
    }
    reconfigure(d.live, d.epoch);
    std::vector<int> left;
    for (int r : senders) {
      if (contains(d.live, r)) left.push_back(r);
    }
    senders = left;
    TORCH_CHECK(!senders.empty() && tries < 8, "replica ", layout_.replica,
                ": no live replica is left to send the state");
  }
}

// A rank of this replacement that died receiving leaves its peers nothing to fail on (they
// received from other ranks): the check, a collective over the replica's own ranks, finds it, and
// the quorum hears of the loss at once instead of after the vote timeout.
void ReplicaQuorum::check_own_replica() {
  if (!replica_check_) return;
  try {
    replica_check_();
  } catch (const std::exception& e) {
    mark_lost();
    throw ReplicaLost(std::string("replica ") + std::to_string(layout_.replica) +
                      " lost a rank while receiving the state: " + e.what());
  }
}

void ReplicaQuorum::mark_lost() {
  try {
    store_->set(lost_key(layout_.replica), bytes_of(std::to_string(layout_.incarnation)));
  } catch (const std::exception&) {
    // The store is gone too: the others find the loss by their timeout.
  }
}

void ReplicaQuorum::finish() { store_->set("finished", bytes_of("1")); }

namespace {

int incarnation_from_environment() {
  const char* text = std::getenv("FSDP_REPLICA_INCARNATION");
  if (!text || !*text) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && value >= 0 && value < (1 << 20),
              "FSDP_REPLICA_INCARNATION must be a count >= 0, got '", text, "'");
  return static_cast<int>(value);
}

}  // namespace

Replicas init_replicas(int shard_group_size, InitOptions options,
                       std::chrono::milliseconds vote_timeout) {
  const LaunchEnv env = LaunchEnv::from_environment();
  const int f = shard_group_size;
  TORCH_CHECK(f >= 1 && env.world_size % f == 0, "fsdp::init_replicas: shard_group_size ", f,
              " must divide WORLD_SIZE ", env.world_size);
  TORCH_CHECK(env.world_size / f >= 2, "fsdp::init_replicas: WORLD_SIZE ", env.world_size,
              " with shard groups of ", f, " is one replica, which has none to survive its loss; "
              "fault tolerance needs at least 2 replicas (a smaller shard group size or more ranks)");
  TORCH_CHECK(env.agent_store, "fsdp::init_replicas: fault-tolerant replicas need a store that "
              "outlives every rank, and rank 0 serves it here; launch with `fsdprun "
              "--fault-tolerant ", f, "`, which serves it from a process of its own and restarts "
              "a lost replica alone");
  ReplicaLayout layout;
  layout.shard_group_size = f;
  layout.replicas = env.world_size / f;
  layout.replica = env.rank / f;
  layout.shard = env.rank % f;
  layout.incarnation = incarnation_from_environment();
  LaunchEnv group = env;
  group.rank = layout.shard;
  group.world_size = f;
  group.local_rank = env.local_rank % f;
  group.local_world_size = std::min(env.local_world_size, f);
  const std::string attempt = "fsdp_replicas_attempt_" + std::to_string(env.restart_count);
  Replicas job;
  job.dist = join_group(env, group, options,
                        attempt + "/replica_" + std::to_string(layout.replica) + "/incarnation_" +
                            std::to_string(layout.incarnation));
  auto quorum_store = c10::make_intrusive<c10d::PrefixStore>(attempt + "/quorum", job.dist->store);
  job.quorum = std::make_unique<ReplicaQuorum>(
      quorum_store, layout, vote_timeout, job.dist->world->timeout(), env.master_addr,
      job.dist->world->settings().socket_interface);
  return job;
}

}  // namespace fsdp
