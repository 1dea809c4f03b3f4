#include "launch/environment_settings.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace fsdp {

namespace {

// A week: longer is a typo, and every wait converts it to int milliseconds somewhere.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

// The value of `name`, or "" when it is unset or empty.
std::string value_of(const EnvLookup& lookup, const std::string& name) {
  return lookup(name).value_or("");
}

void check_omp_num_threads(const std::string& value) {
  if (value.empty()) return;
  char* end = nullptr;
  const long threads = std::strtol(value.c_str(), &end, 10);
  TORCH_CHECK(end == value.c_str() + value.size() && threads >= 1 && threads <= 4096,
              "environment variable OMP_NUM_THREADS='", value,
              "' must be a whole number of threads in [1, 4096] (or unset it: each rank then "
              "gets cores / LOCAL_WORLD_SIZE)");
}

std::optional<std::chrono::milliseconds> parse_timeout(const std::string& value) {
  if (value.empty()) return std::nullopt;
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  TORCH_CHECK(end == value.c_str() + value.size() && std::isfinite(seconds) && seconds >= 0.001 &&
                  seconds <= kMaxTimeoutSeconds,
              "environment variable FSDP_TIMEOUT_SECONDS='", value,
              "' must be a number of seconds in [0.001, ", static_cast<int64_t>(kMaxTimeoutSeconds),
              "] (how long to wait for a peer rank before failing; unset: 300)");
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

std::optional<CpuCollectives> parse_cpu_collectives(const std::string& value) {
  TORCH_CHECK(value.empty() || value == "shm" || value == "ring",
              "environment variable FSDP_CPU_COLLECTIVES='", value,
              "' must be 'shm' (shared memory between ranks on one host, the default) or 'ring' "
              "(Gloo's send/recv, also across hosts)");
  if (value.empty()) return std::nullopt;
  return value == "ring" ? CpuCollectives::Ring : CpuCollectives::SharedMemory;
}

std::optional<CudaCollectives> parse_cuda_collectives(const std::string& value) {
  TORCH_CHECK(value.empty() || value == "nccl" || value == "staged", "FSDP_CUDA_COLLECTIVES='",
              value, "': use 'nccl' (the default) or 'staged' (Gloo through host memory, for ranks "
              "that share a GPU)");
  if (value.empty()) return std::nullopt;
  return value == "staged" ? CudaCollectives::Staged : CudaCollectives::Nccl;
}

}  // namespace

EnvironmentSettings EnvironmentSettings::from(const EnvLookup& lookup) {
  EnvironmentSettings settings;
  const std::string threads = value_of(lookup, "OMP_NUM_THREADS");
  check_omp_num_threads(threads);
  settings.threads_chosen = lookup("OMP_NUM_THREADS").has_value();
  settings.timeout = parse_timeout(value_of(lookup, "FSDP_TIMEOUT_SECONDS"));
  settings.cpu_collectives = parse_cpu_collectives(value_of(lookup, "FSDP_CPU_COLLECTIVES"));
  settings.cuda_collectives = parse_cuda_collectives(value_of(lookup, "FSDP_CUDA_COLLECTIVES"));
  settings.gloo_socket_ifname = value_of(lookup, "GLOO_SOCKET_IFNAME");
  if (const auto local = lookup("LOCAL_WORLD_SIZE")) settings.local_world_size = std::atoi(local->c_str());
  return settings;
}

EnvironmentSettings EnvironmentSettings::from_environment() { return from(process_environment()); }

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

}  // namespace fsdp
