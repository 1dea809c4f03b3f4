#include <fsdp/distributed.h>
#include <fsdp/memory.h>

#include "gloo_backend.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
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

std::chrono::milliseconds timeout_from_env(std::chrono::milliseconds fallback) {
  const char* value = std::getenv("FSDP_TIMEOUT_SECONDS");
  if (value == nullptr || *value == '\0') return fallback;
  double seconds = std::atof(value);
  TORCH_CHECK(seconds > 0, "FSDP_TIMEOUT_SECONDS='", value, "' must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
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
  install_memory_counter();
  auto dist = std::make_shared<Distributed>();
  dist->env = LaunchEnv::from_environment();
  const LaunchEnv& env = dist->env;
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
                " ranks started?): ", e.what());
  }
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", store);
  auto backend = make_gloo_backend(world_store, env.rank, env.world_size, timeout, env.master_addr);
  dist->world = std::make_shared<ProcessGroup>(backend, world_store, env.rank, env.world_size,
                                               timeout, "world", env.master_addr);
  return dist;
}

}  // namespace fsdp
