// Where this process stands in the job, from the launcher's environment: torchrun's variables
// (also set by fsdprun), else Slurm's (srun), else Open MPI's (mpirun).
//
// [Note: launchers]
// torchrun's contract wins whenever RANK is set. A Slurm task has SLURM_PROCID, an Open MPI rank
// OMPI_COMM_WORLD_RANK; from those the same six values are derived, and export_to_environment()
// writes them back as torchrun's variables, so that everything downstream (the hybrid strategy's
// default shard group, a user's own code) reads one contract. Slurm gives no rendezvous address:
// MASTER_ADDR defaults to the first node of the step's node list, MASTER_PORT to
// 10000 + SLURM_JOB_ID % 20000 (the same on every node of a job, below the ephemeral ports).
// Open MPI gives neither: mpirun -x MASTER_ADDR=... -x MASTER_PORT=... must pass them.
#include <fsdp/launch_env.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <vector>

namespace fsdp {

namespace {

const char* kContract =
    " fsdp reads torchrun's environment: launch with `fsdprun --nproc-per-node N PROGRAM` or "
    "`torchrun --no-python --nproc-per-node N PROGRAM`, or set RANK, WORLD_SIZE, LOCAL_RANK, "
    "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself (srun's SLURM_* and mpirun's "
    "OMPI_COMM_WORLD_* variables are understood too); with none of these set, it runs as one rank.";

// Reads variables through `lookup` and reports every missing one at once.
class Reader {
 public:
  Reader(const EnvLookup& lookup, std::string launcher) : lookup_(lookup), launcher_(std::move(launcher)) {}

  std::optional<std::string> get(const std::string& name) const {
    auto value = lookup_(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  }

  // The value, or "" after noting the name as missing.
  std::string require(const std::string& name) {
    auto value = get(name);
    if (!value) missing_.push_back(name);
    return value.value_or("");
  }

  // The first of `names` that is set, or nullopt.
  std::optional<std::string> first_of(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (auto value = get(name)) return value;
    }
    return std::nullopt;
  }

  // The first of `names` that is set, or "" after noting them as missing.
  std::string require_one_of(std::initializer_list<const char*> names) {
    if (auto value = first_of(names)) return *value;
    std::string alternatives;
    for (const char* name : names) alternatives += (alternatives.empty() ? "" : " or ") + std::string(name);
    missing_.push_back(alternatives);
    return "";
  }

  void throw_if_missing(const std::string& hint) const {
    if (missing_.empty()) return;
    std::string names;
    for (const auto& name : missing_) names += (names.empty() ? "" : ", ") + name;
    TORCH_CHECK(false, "environment variable", missing_.size() > 1 ? "s " : " ", names,
                missing_.size() > 1 ? " are" : " is", " not set (", launcher_, ").", hint,
                kContract);
  }

 private:
  const EnvLookup& lookup_;
  std::string launcher_;
  std::vector<std::string> missing_;
};

int to_int(const std::string& name, const std::string& text, int min_value, int max_value) {
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

constexpr int kMaxWorld = 1 << 20;

LaunchEnv from_torchrun(const EnvLookup& lookup) {
  Reader env(lookup, "torchrun's contract");
  const std::string names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                               "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> values;
  for (const auto& name : names) values.push_back(env.require(name));
  env.throw_if_missing("");
  LaunchEnv out;
  out.launcher = "torchrun";
  out.world_size = to_int("WORLD_SIZE", values[1], 1, kMaxWorld);
  out.rank = to_int("RANK", values[0], 0, out.world_size - 1);
  out.local_world_size = to_int("LOCAL_WORLD_SIZE", values[3], 1, out.world_size);
  out.local_rank = to_int("LOCAL_RANK", values[2], 0, out.local_world_size - 1);
  out.master_addr = values[4];
  out.master_port = to_int("MASTER_PORT", values[5], 1, 65535);
  // torchrun's elastic agent serves the store itself and restarts ranks (see init_distributed).
  out.agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (auto count = env.get("TORCHELASTIC_RESTART_COUNT")) {
    out.restart_count = to_int("TORCHELASTIC_RESTART_COUNT", *count, 0, 1 << 20);
  }
  return out;
}

LaunchEnv from_slurm(const EnvLookup& lookup) {
  Reader env(lookup, "a Slurm task: SLURM_PROCID is set");
  const std::string rank = env.require("SLURM_PROCID");
  const std::string ntasks = env.require_one_of({"SLURM_NTASKS", "SLURM_NPROCS"});
  const std::string local_rank = env.require("SLURM_LOCALID");
  const std::string node_id = env.require("SLURM_NODEID");
  const std::string tasks_per_node =
      env.require_one_of({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  const auto node_list = env.first_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  const std::string master_addr =
      env.get("MASTER_ADDR") || !node_list ? env.require("MASTER_ADDR") : first_slurm_node(*node_list);
  const auto job_id = env.first_of({"SLURM_JOB_ID", "SLURM_JOBID"});
  const std::string master_port = env.get("MASTER_PORT") || !job_id ? env.require("MASTER_PORT") : "";
  env.throw_if_missing(" Start the tasks with srun (it sets them), or export the missing ones.");

  LaunchEnv out;
  out.launcher = "slurm";
  out.world_size = to_int("SLURM_NTASKS", ntasks, 1, kMaxWorld);
  out.rank = to_int("SLURM_PROCID", rank, 0, out.world_size - 1);
  const std::vector<int> per_node = parse_slurm_tasks_per_node(tasks_per_node);
  const int node = to_int("SLURM_NODEID", node_id, 0, static_cast<int>(per_node.size()) - 1);
  out.local_world_size = per_node[node];
  TORCH_CHECK(out.local_world_size <= out.world_size, "SLURM_TASKS_PER_NODE='", tasks_per_node,
              "' gives node ", node, " more tasks than SLURM_NTASKS=", out.world_size);
  out.local_rank = to_int("SLURM_LOCALID", local_rank, 0, out.local_world_size - 1);
  out.master_addr = master_addr;
  out.master_port = !master_port.empty() ? to_int("MASTER_PORT", master_port, 1, 65535)
                                         : 10000 + to_int("SLURM_JOB_ID", *job_id, 0, 1 << 30) % 20000;
  return out;
}

LaunchEnv from_open_mpi(const EnvLookup& lookup) {
  Reader env(lookup, "an Open MPI rank: OMPI_COMM_WORLD_RANK is set");
  const std::string rank = env.require("OMPI_COMM_WORLD_RANK");
  const std::string size = env.require("OMPI_COMM_WORLD_SIZE");
  const std::string local_rank = env.require("OMPI_COMM_WORLD_LOCAL_RANK");
  const std::string local_size = env.require("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string master_addr = env.require("MASTER_ADDR");
  const std::string master_port = env.require("MASTER_PORT");
  env.throw_if_missing(" mpirun sets the OMPI_* ones; pass the rendezvous address with `mpirun -x "
                       "MASTER_ADDR=<first host> -x MASTER_PORT=<free port> ...`.");
  LaunchEnv out;
  out.launcher = "openmpi";
  out.world_size = to_int("OMPI_COMM_WORLD_SIZE", size, 1, kMaxWorld);
  out.rank = to_int("OMPI_COMM_WORLD_RANK", rank, 0, out.world_size - 1);
  out.local_world_size = to_int("OMPI_COMM_WORLD_LOCAL_SIZE", local_size, 1, out.world_size);
  out.local_rank = to_int("OMPI_COMM_WORLD_LOCAL_RANK", local_rank, 0, out.local_world_size - 1);
  out.master_addr = master_addr;
  out.master_port = to_int("MASTER_PORT", master_port, 1, 65535);
  return out;
}

// No launcher's variable at all: a program started by hand runs as the only rank. Any one of them
// set means a launcher was meant, so a partial set still names what is missing.
bool started_alone(const std::function<bool(const char*)>& has) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                           "MASTER_PORT", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    if (has(name)) return false;
  }
  return true;
}

}  // namespace

std::string first_slurm_node(const std::string& node_list) {
  // "gpu[07-09,12],cpu1" -> "gpu07"; "a[1-2]-b[3-4]" -> "a1-b3".
  std::string host;
  for (size_t i = 0; i < node_list.size() && node_list[i] != ','; ++i) {
    if (node_list[i] != '[') {
      host += node_list[i];
      continue;
    }
    const size_t close = node_list.find(']', i);
    TORCH_CHECK(close != std::string::npos, "Slurm node list '", node_list, "' has an unclosed '['");
    const std::string range = node_list.substr(i + 1, close - i - 1);
    host += range.substr(0, range.find_first_of(",-"));
    i = close;
  }
  TORCH_CHECK(!host.empty(), "Slurm node list '", node_list, "' names no node; set MASTER_ADDR");
  return host;
}

std::vector<int> parse_slurm_tasks_per_node(const std::string& text) {
  // "2(x3),1" -> {2, 2, 2, 1}
  std::vector<int> counts;
  size_t at = 0;
  const std::string what = "SLURM_TASKS_PER_NODE";
  while (at < text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t paren = item.find("(x");
    const int tasks = to_int(what, item.substr(0, paren), 1, kMaxWorld);
    int repeat = 1;
    if (paren != std::string::npos) {
      TORCH_CHECK(item.back() == ')', "environment variable ", what, "='", text,
                  "' is not a list like '2(x3),1'");
      repeat = to_int(what, item.substr(paren + 2, item.size() - paren - 3), 1, kMaxWorld);
    }
    counts.insert(counts.end(), repeat, tasks);
    at = end + 1;
  }
  TORCH_CHECK(!counts.empty(), "environment variable ", what, " is empty");
  return counts;
}

LaunchEnv LaunchEnv::from(const EnvLookup& lookup) {
  auto has = [&](const char* name) {
    auto value = lookup(name);
    return value && !value->empty();
  };
  if (started_alone(has)) {
    LaunchEnv alone;
    alone.launcher = "none";
    alone.master_port = 0;  // the OS picks the store's port: never one another job holds
    return alone;
  }
  if (!has("RANK") && has("SLURM_PROCID")) return from_slurm(lookup);
  if (!has("RANK") && has("OMPI_COMM_WORLD_RANK")) return from_open_mpi(lookup);
  return from_torchrun(lookup);
}

LaunchEnv LaunchEnv::from_environment() { return from(process_environment()); }

void LaunchEnv::export_to_environment() const {
  const std::pair<const char*, std::string> values[] = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(master_port)}};
  for (const auto& [name, value] : values) setenv(name, value.c_str(), 1);
}

}  // namespace fsdp
