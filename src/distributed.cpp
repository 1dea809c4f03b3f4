#include <fsdp/distributed.h>
#include <fsdp/peer_errors.h>

#include "gloo_backend.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <thread>

namespace fsdp {

namespace {

const char* kContract =
    " fsdp reads torchrun's environment: launch with `fsdprun --nproc-per-node N PROGRAM` or "
    "`torchrun --no-python --nproc-per-node N PROGRAM`, or set RANK, WORLD_SIZE, LOCAL_RANK, "
    "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself.";

std::string require_env(const char* name) {
  const char* value = std::getenv(name);
  TORCH_CHECK(value != nullptr && *value != '\0', "environment variable ", name, " is not set.",
              kContract);
  return value;
}

int int_env(const char* name, int min_value, int max_value) {
  std::string text = require_env(name);
  size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(used == text.size() && value >= min_value && value <= max_value,
              "environment variable ", name, "='", text, "' is not an integer in [", min_value,
              ", ", max_value, "].", kContract);
  return static_cast<int>(value);
}

// A week: longer is a typo, and every wait converts it to int milliseconds somewhere.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

std::chrono::milliseconds timeout_from_env(std::chrono::milliseconds fallback) {
  const char* value = std::getenv("FSDP_TIMEOUT_SECONDS");
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  TORCH_CHECK(end == value + std::strlen(value) && std::isfinite(seconds) && seconds >= 0.001 &&
                  seconds <= kMaxTimeoutSeconds,
              "environment variable FSDP_TIMEOUT_SECONDS='", value,
              "' must be a number of seconds in [0.001, ", static_cast<int64_t>(kMaxTimeoutSeconds),
              "] (how long to wait for a peer rank before failing; unset: 300)");
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

// What an exception says, without the C++ backtrace that c10::Error::what() appends.
std::string message_of(const std::exception& e) {
  if (auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

void check_omp_num_threads() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (value == nullptr || *value == '\0') return;
  char* end = nullptr;
  const long threads = std::strtol(value, &end, 10);
  TORCH_CHECK(end == value + std::strlen(value) && threads >= 1 && threads <= 4096,
              "environment variable OMP_NUM_THREADS='", value,
              "' must be a whole number of threads in [1, 4096] (or unset it: each rank then "
              "gets cores / LOCAL_WORLD_SIZE)");
}

// Every rank announces itself in the store before the process group forms, so that a RANK
// used twice or a rank that never starts is named instead of surfacing as a store key.
void check_ranks_joined(c10d::Store& store, const LaunchEnv& env, std::chrono::milliseconds timeout) {
  const std::string prefix = "fsdp_joined/";
  const int64_t count = store.add(prefix + std::to_string(env.rank), 1);
  TORCH_CHECK(count == 1, "rank ", env.rank, ": another process also has RANK=", env.rank,
              " (WORLD_SIZE=", env.world_size, "); every process needs its own RANK in [0, ",
              env.world_size - 1, "] (launch with fsdprun or torchrun, which set them)");
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
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
                " timed out after ", timeout.count() / 1000.0, " s (FSDP_TIMEOUT_SECONDS) waiting for ",
                missing.empty() ? "the other ranks" : "rank(s) " + missing, " of WORLD_SIZE=",
                env.world_size, ": did they start, with the same MASTER_ADDR/MASTER_PORT, each with "
                "its own RANK?");
  }
}

// Gloo names a peer by its socket address ("[127.0.0.1]:41234"), not by its rank. Every rank's
// Gloo listening port, read once from the store after the world group connects (the key Gloo's
// full-mesh rendezvous writes: "0/RANK" under the group's prefix, whose serialized address has
// the sockaddr's family at byte 18 and the port after it, in torch 2.13's layout; anything else
// is skipped): rank_of_port[port] = rank.
std::map<int, int>& world_ports() {
  static std::map<int, int> ports;
  return ports;
}

int& world_rank() {
  static int rank = -1;
  return rank;
}

void record_gloo_ports(c10d::Store& world_store, int world_size) {
  for (int r = 0; r < world_size; ++r) {
    try {
      const std::vector<uint8_t> blob = world_store.get("0/" + std::to_string(r));
      for (size_t at = 16; at + 4 <= blob.size() && at <= 24; at += 2) {
        const bool inet = (blob[at] == AF_INET || blob[at] == AF_INET6) && blob[at + 1] == 0;
        const int port = blob[at + 2] << 8 | blob[at + 3];
        if (inet && port > 0) {
          world_ports()[port] = r;
          break;
        }
      }
    } catch (const std::exception&) {
      // Best effort: without the table, errors keep Gloo's own wording.
    }
  }
}

void set_threads_per_rank(int local_world_size) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;  // the user (or fsdprun) decided
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(std::max(1, cores / local_world_size));
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv env;
  env.world_size = int_env("WORLD_SIZE", 1, 1 << 20);
  env.rank = int_env("RANK", 0, env.world_size - 1);
  env.local_world_size = int_env("LOCAL_WORLD_SIZE", 1, env.world_size);
  env.local_rank = int_env("LOCAL_RANK", 0, env.local_world_size - 1);
  env.master_addr = require_env("MASTER_ADDR");
  env.master_port = int_env("MASTER_PORT", 1, 65535);
  return env;
}

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend,
                           c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                           std::chrono::milliseconds timeout, std::string name,
                           std::string hostname)
    : backend_(std::move(backend)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      name_(std::move(name)),
      hostname_(std::move(hostname)) {}

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
  auto backend = make_gloo_backend(store, rank, size, timeout_, hostname_);
  return std::make_shared<ProcessGroup>(backend, store, rank, size, timeout_, key, hostname_);
}

std::shared_ptr<Distributed> init_distributed(InitOptions options) {
  auto dist = std::make_shared<Distributed>();
  dist->env = LaunchEnv::from_environment();
  const LaunchEnv& env = dist->env;
  check_omp_num_threads();
  if (options.set_threads()) set_threads_per_rank(env.local_world_size);
  auto timeout = timeout_from_env(options.timeout());

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = env.world_size;
  store_options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", env.rank, ": rendezvous at ", env.master_addr, ":", env.master_port,
                " failed (is MASTER_PORT free, and are all ", env.world_size,
                " ranks started?): ", message_of(e));
  }
  check_ranks_joined(*store, env, timeout);
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", store);
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = make_gloo_backend(world_store, env.rank, env.world_size, timeout, env.master_addr);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", env.rank, ": connecting the ", env.world_size,
                " ranks (Gloo) failed: ", message_of(e),
                " (a peer rank may have died during start-up; GLOO_SOCKET_IFNAME, if set, must "
                "name a network interface of this machine)");
  }
  dist->world = std::make_shared<ProcessGroup>(backend, world_store, env.rank, env.world_size,
                                               timeout, "world", env.master_addr);
  world_rank() = env.rank;
  record_gloo_ports(*world_store, env.world_size);
  return dist;
}

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
    // Gloo prints the port in network byte order (e.g. 42513 as 4518): try both.
    const int port = std::stoi(m[2].str());
    auto rank = world_ports().find(port);
    if (rank == world_ports().end()) rank = world_ports().find((port & 0xFF) << 8 | (port >> 8 & 0xFF));
    if (rank != world_ports().end()) {
      out += " (rank " + std::to_string(rank->second) + ")";
    } else {
      unknown = true;
    }
  }
  out += message.substr(last);
  if (unknown && !world_ports().empty()) {
    // The address is the far end of a connection the peer opened: any other rank could own it.
    std::string others;
    for (const auto& entry : world_ports()) {
      if (entry.second != world_rank()) others += (others.empty() ? "" : ", ") + std::to_string(entry.second);
    }
    out += "\n(Gloo names the peer by a socket address that is not a rank's listening port; the "
           "peer that failed is one of rank(s) " + others + " of this rank " +
           std::to_string(world_rank()) + "; its own log, or fsdprun's summary, names the cause)";
  }
  return out;
}

}  // namespace fsdp
