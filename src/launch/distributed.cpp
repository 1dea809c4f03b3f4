#include <fsdp/distributed.h>
#include <fsdp/error_text.h>
#include <fsdp/peer_errors.h>

#include "launch/environment_settings.h"
#include "launch/gloo_backend.h"
#include "launch/listener_probe.h"
#include "launch/join_group.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cmath>
#include <csignal>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <regex>
#include <thread>

namespace fsdp {

namespace {

// The one deadline of the whole rendezvous (store, joining), so that its steps together end
// within FSDP_TIMEOUT_SECONDS.
struct Deadline {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point end;

  explicit Deadline(std::chrono::milliseconds timeout) : end(start + timeout) {}
  // At least 1 ms: c10d takes 0 as "no timeout".
  std::chrono::milliseconds left() const {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      end - std::chrono::steady_clock::now()));
  }
  double waited_seconds() const {
    const auto waited = std::chrono::steady_clock::now() - start;
    return std::round(std::chrono::duration<double>(waited).count() * 10) / 10;
  }
};

// Every rank announces itself in the store before the process group forms, so that a RANK
// used twice or a rank that never starts is named instead of surfacing as a store key.
void check_ranks_joined(c10d::Store& store, const LaunchEnv& env, std::chrono::milliseconds timeout,
                        const Deadline& deadline) {
  const std::string prefix = "fsdp_joined/";
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(prefix + std::to_string(r));
  const int64_t count = store.add(prefix + std::to_string(env.rank), 1);
  // A store where every rank had joined before this one most likely belongs to a job that is
  // running: this process reached another job's rank 0 (its own could not take the port).
  TORCH_CHECK(count == 1 || !store.check(keys), "rank ", env.rank, ": the rendezvous at ",
              env.master_addr, ":", env.master_port, " already has all ", env.world_size,
              " ranks: MASTER_PORT ", env.master_port, " is most likely in use by another job "
              "that is running; give this job a free MASTER_PORT (fsdprun picks one when "
              "--master-port is not given). Otherwise another process of this job also has RANK=",
              env.rank);
  TORCH_CHECK(count == 1, "rank ", env.rank, ": another process also has RANK=", env.rank,
              " (WORLD_SIZE=", env.world_size, "); every process needs its own RANK in [0, ",
              env.world_size - 1, "] (launch with fsdprun or torchrun, which set them)");
  try {
    store.wait(keys, deadline.left());
  } catch (const std::exception&) {
    std::string missing;
    for (int r = 0; r < env.world_size; ++r) {
      bool joined = false;
      try {
        joined = store.check({keys[r]});
      } catch (const std::exception&) {
      }
      if (!joined) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    TORCH_CHECK(false, "rank ", env.rank, ": rendezvous at ", env.master_addr, ":", env.master_port,
                " timed out after ", deadline.waited_seconds(), " s (FSDP_TIMEOUT_SECONDS=",
                timeout.count() / 1000.0, ") waiting for ",
                missing.empty() ? "the other ranks" : "rank(s) " + missing, " of WORLD_SIZE=",
                env.world_size, ": did they start, with the same MASTER_ADDR/MASTER_PORT, each with "
                "its own RANK?");
  }
}

// Gloo names a peer by its socket address ("[127.0.0.1]:41234"), not by its rank. Every rank's
// Gloo listening address, read once from the store after the world group connects
// (parse_gloo_listening_address; a rank whose address cannot be read is left out).
struct PeerTable {
  std::map<int, int> rank_of_port;
  std::multimap<std::string, int> ranks_of_address;
  int my_rank = -1;
};

PeerTable& peers() {
  static PeerTable table;
  return table;
}

void record_gloo_addresses(c10d::Store& world_store, int world_size) {
  for (int r = 0; r < world_size; ++r) {
    try {
      const GlooListeningAddress address =
          parse_gloo_listening_address(world_store.get("0/" + std::to_string(r)));
      peers().rank_of_port[address.port] = r;
      if (!address.ipv4.empty()) peers().ranks_of_address.emplace(address.ipv4, r);
    } catch (const std::exception&) {
      // Best effort: without the table, errors keep Gloo's own wording.
    }
  }
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// [Note: attempts under torchrun's agent]
// torchrun's elastic agent serves the store and keeps it across restarts, so the keys of a
// failed attempt (who joined, Gloo's addresses) are still there when the ranks start again: each
// attempt needs keys of its own. TORCHELASTIC_RESTART_COUNT cannot name the attempt: an agent
// whose own ranks were healthy restarts them for another node's failure without counting a
// restart, so nodes disagree. Every attempt restarts every rank of the world, so the number of
// times this rank (of a world this size) has joined the store is the same on every rank.
c10::intrusive_ptr<c10d::Store> this_attempts_store(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const LaunchEnv& env) {
  if (!env.agent_store) return store;
  const int64_t attempt = store->add("fsdp_starts/w" + std::to_string(env.world_size) + "/r" +
                                         std::to_string(env.rank), 1);
  return c10::make_intrusive<c10d::PrefixStore>("fsdp_attempt_" + std::to_string(attempt), store);
}


c10::intrusive_ptr<c10d::TCPStore> connect_store(const LaunchEnv& env,
                                                 std::chrono::milliseconds timeout,
                                                 const Deadline& deadline) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = env.world_size;
  // c10d's own wait for the workers counts in whole seconds past our deadline; check_ranks_joined
  // waits for them within it and names the ranks that did not come.
  options.waitWorkers = false;
  try {
    if (!options.isServer) wait_for_listener(env.master_addr, env.master_port, deadline.end);
    options.timeout = deadline.left();
    if (!options.isServer) return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    // The server listens on every address; its own client connects over loopback, and the probe
    // checks, within the deadline, that MASTER_ADDR reaches it (c10d's connect to an address
    // nobody has waits for the kernel's SYN retries, past the deadline).
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    wait_for_listener(env.master_addr, static_cast<int>(store->getPort()), deadline.end);
    return store;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", env.rank, ": rendezvous at ", env.master_addr, ":", env.master_port,
                " failed after ", deadline.waited_seconds(), " s (FSDP_TIMEOUT_SECONDS=",
                timeout.count() / 1000.0, ") (",
                env.agent_store ? "the elastic agent's store: is its node reachable?"
                                             : "is MASTER_PORT free, is MASTER_ADDR this job's first "
                                               "host and reachable from here, and are all ",
                env.agent_store ? "" : std::to_string(env.world_size) + " ranks started?",
                "): ", message_of(e));
  }
}

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// Before joining: so that every rank's name is in the store once all have joined.
void announce_host(c10d::Store& store, int rank) {
  const std::string name = this_host_name();
  store.set("fsdp_host/" + std::to_string(rank), std::vector<uint8_t>(name.begin(), name.end()));
}

std::vector<std::string> read_hosts(c10d::Store& store, int world_size) {
  std::vector<std::string> hosts;
  for (int r = 0; r < world_size; ++r) {
    const std::vector<uint8_t> name = store.get("fsdp_host/" + std::to_string(r));
    hosts.emplace_back(name.begin(), name.end());
  }
  return hosts;
}

void set_threads_per_rank(int local_world_size) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(std::max(1, cores / local_world_size));
}

}  // namespace

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend,
                           c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                           std::chrono::milliseconds timeout, std::string name,
                           std::string hostname, GroupSettings settings)
    : backend_(std::move(backend)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      name_(std::move(name)),
      hostname_(std::move(hostname)),
      settings_(std::move(settings)) {
  for (int r = 0; r < size_; ++r) world_ranks_.push_back(r);
}

std::string ProcessGroup::describe_member(int group_rank) const {
  std::string out = "rank " + std::to_string(world_ranks_.at(group_rank));
  if (!hosts_.empty()) out += " on " + hosts_.at(group_rank);
  return out;
}

std::string ProcessGroup::next_store_key(const std::string& what) {
  return what + "/" + std::to_string(store_sequence_++);
}

std::shared_ptr<ProcessGroup> ProcessGroup::subgroup(const std::vector<int>& ranks,
                                                    const std::string& name) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  TORCH_CHECK(me != ranks.end(), "subgroup '", name, "': rank ", rank_, " is not a member");
  std::string key = name_ + "/" + name;
  for (int r : ranks) key += "." + std::to_string(r);
  auto store = c10::make_intrusive<c10d::PrefixStore>(key, store_);
  const int rank = static_cast<int>(me - ranks.begin());
  const int size = static_cast<int>(ranks.size());
  auto backend =
      make_gloo_backend(store, rank, size, timeout_, hostname_, settings_.socket_interface);
  auto group = std::make_shared<ProcessGroup>(backend, store, rank, size, timeout_, key, hostname_,
                                              settings_);
  group->world_ranks_.clear();
  for (int r : ranks) group->world_ranks_.push_back(world_ranks_.at(r));
  if (!hosts_.empty()) {
    std::vector<std::string> hosts;
    for (int r : ranks) hosts.push_back(hosts_.at(r));
    group->set_hosts(std::move(hosts));
  }
  return group;
}

namespace {

// A write to the socket of a peer that died raises SIGPIPE, which kills a process by default
// before Gloo can report the failed write (EPIPE) as an error naming the peer. A program that
// installed its own handler keeps it.
void ignore_sigpipe_by_default() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

// [Note: a quiet rendezvous]
// c10d logs each failed store operation (a peer's store that closed, a timeout) as a warning
// with a C++ backtrace before it throws. During the rendezvous every such failure reaches this
// file's own one-line message (the rank that never came, the port in use), so c10's log level is
// raised to FATAL while the rendezvous runs; training's logs are untouched.
class QuietC10dLogs {
 public:
  QuietC10dLogs() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = kFatal; }
  ~QuietC10dLogs() { FLAGS_caffe2_log_level = saved_; }
  QuietC10dLogs(const QuietC10dLogs&) = delete;
  QuietC10dLogs& operator=(const QuietC10dLogs&) = delete;

 private:
  static constexpr int kFatal = 3;  // c10's INFO 0, WARNING 1, ERROR 2, FATAL 3
  int saved_;
};

// The options' choices, else the environment's, else the defaults.
GroupSettings settings_of_group(const InitOptions& options, const EnvironmentSettings& settings) {
  GroupSettings group;
  group.cpu_collectives =
      options.cpu_collectives().value_or(settings.cpu_collectives.value_or(group.cpu_collectives));
  group.cuda_collectives = options.cuda_collectives().value_or(
      settings.cuda_collectives.value_or(group.cuda_collectives));
  group.socket_interface = settings.gloo_socket_ifname;
  group.local_world_size = settings.local_world_size;
  return group;
}

}  // namespace

std::shared_ptr<Distributed> init_distributed(InitOptions options) {
  const LaunchEnv env = LaunchEnv::from_environment();
  return join_group(env, env, std::move(options), "");
}

// [Note: one rendezvous, two uses]
// `process` is this process's launch (it connects to the store); `group` the ranks that form the
// world process group: the same for init_distributed, one replica's ranks for init_replicas
// (replica_quorum.cpp), whose keys then live under `store_prefix` in a store that outlives them.
std::shared_ptr<Distributed> join_group(const LaunchEnv& process, const LaunchEnv& group,
                                        InitOptions options, const std::string& store_prefix) {
  ignore_sigpipe_by_default();
  auto dist = std::make_shared<Distributed>();
  dist->env = group;
  const LaunchEnv& env = dist->env;
  if (env.launcher != "torchrun") env.export_to_environment();  // [Note: launchers]
  const EnvironmentSettings settings = EnvironmentSettings::from_environment();
  if (options.set_threads() && !settings.threads_chosen) set_threads_per_rank(env.local_world_size);
  const auto timeout = settings.timeout.value_or(options.timeout());
  const GroupSettings group_settings = settings_of_group(options, settings);
  // The rendezvous, on every rank, ends within one timeout: a lone rank gives up in time.
  const Deadline deadline(timeout);
  QuietC10dLogs quiet;

  auto tcp_store = connect_store(process, timeout, deadline);
  if (env.master_port == 0) {  // run alone: the port the OS chose, for code that reads MASTER_PORT
    dist->env.master_port = tcp_store->getPort();
    env.export_to_environment();
  }
  c10::intrusive_ptr<c10d::Store> store;
  if (store_prefix.empty()) {
    store = this_attempts_store(tcp_store, env);
  } else {
    store = c10::make_intrusive<c10d::PrefixStore>(store_prefix, tcp_store);
  }
  announce_host(*store, env.rank);
  check_ranks_joined(*store, env, timeout, deadline);
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", store);
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = make_gloo_backend(world_store, env.rank, env.world_size, timeout, env.master_addr,
                                group_settings.socket_interface);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", env.rank, ": connecting the ", env.world_size,
                " ranks (Gloo) failed: ", message_of(e),
                " (a peer rank may have died during start-up; GLOO_SOCKET_IFNAME, if set, must "
                "name a network interface of this machine)");
  }
  dist->world = std::make_shared<ProcessGroup>(backend, world_store, env.rank, env.world_size,
                                               timeout, "world", env.master_addr, group_settings);
  dist->world->set_hosts(read_hosts(*store, env.world_size));
  dist->store = tcp_store;
  peers().my_rank = env.rank;
  record_gloo_addresses(*world_store, env.world_size);
  return dist;
}

namespace {

// The rank a Gloo peer address belongs to: " (rank 2)", " (one of rank(s) 2, 3 at 10.0.0.2)"
// when only the host is known, or "" when any other rank could own it.
std::string rank_of_peer(const std::string& address, int port) {
  const PeerTable& table = peers();
  // Gloo prints the port in network byte order (e.g. 42513 as 4518): try both.
  for (int candidate : {port, (port & 0xFF) << 8 | (port >> 8 & 0xFF)}) {
    auto rank = table.rank_of_port.find(candidate);
    if (rank != table.rank_of_port.end()) return " (rank " + std::to_string(rank->second) + ")";
  }
  // The far end of a connection the peer opened: its address still names its host.
  std::vector<int> on_host;
  auto [begin, end] = table.ranks_of_address.equal_range(address);
  for (auto it = begin; it != end; ++it) {
    if (it->second != table.my_rank) on_host.push_back(it->second);
  }
  const size_t others = table.rank_of_port.size() - 1;
  if (on_host.empty() || on_host.size() >= others) return "";
  return " (one of rank(s) " + join_ranks(on_host) + " at " + address + ")";
}

}  // namespace

std::string name_peer_ranks(const std::string& message) {
  static const std::regex address_re(R"(\[([0-9a-fA-F.:]+)\]:([0-9]{1,5}))");
  std::string out;
  bool unknown = false;
  auto begin = std::sregex_iterator(message.begin(), message.end(), address_re);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    const size_t end = static_cast<size_t>(m.position(0) + m.length(0));
    out += message.substr(last, end - last);
    last = end;
    const std::string rank = rank_of_peer(m[1].str(), std::stoi(m[2].str()));
    out += rank;
    unknown = unknown || rank.empty();
  }
  out += message.substr(last);
  if (unknown && !peers().rank_of_port.empty()) {
    std::vector<int> others;
    for (const auto& entry : peers().rank_of_port) {
      if (entry.second != peers().my_rank) others.push_back(entry.second);
    }
    out += "\n(Gloo names the peer by a socket address that is not a rank's listening port; the "
           "peer that failed is one of rank(s) " + join_ranks(others) + " of this rank " +
           std::to_string(peers().my_rank) + "; its own log, or fsdprun's summary, names the cause)";
  }
  return out;
}

}  // namespace fsdp
