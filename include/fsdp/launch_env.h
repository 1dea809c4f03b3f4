#pragma once
/// This process's place in the job, as its launcher (torchrun, fsdprun, Slurm, Open MPI) describes
/// it in the environment. Read by init_distributed (<fsdp/distributed.h>); it depends on nothing
/// else of the library.

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

/// An environment variable's value by name (nullopt: not set).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// This process's place in the job, as its launcher describes it. [Note: launchers]
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Which contract the values came from: "torchrun" (also fsdprun), "slurm", "openmpi", or
  /// "none": no launcher's variable is set, the program runs alone (rank 0 of 1, MASTER_PORT 0 until
  /// init_distributed's store takes a port the OS chose).
  std::string launcher = "torchrun";
  /// Under torchrun's elastic agent (TORCHELASTIC_USE_AGENT_STORE=True) the agent serves the
  /// store at MASTER_ADDR:MASTER_PORT and keeps it across restarts.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT (fsdprun --max-restarts sets it too): 0 on the first attempt.
  int restart_count = 0;

  /// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; without
  /// RANK, Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
  /// SLURM_TASKS_PER_NODE; MASTER_ADDR/PORT default from SLURM_JOB_NODELIST and SLURM_JOB_ID) or
  /// Open MPI's (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MASTER_ADDR/PORT from
  /// `mpirun -x`); none of them set: one rank alone. Missing variables throw naming all of them; a malformed or inconsistent one
  /// throws with its name and what it should hold.
  static LaunchEnv from(const EnvLookup& lookup);
  static LaunchEnv from_environment();
  /// Sets torchrun's six variables to these values (for code that reads them).
  void export_to_environment() const;
};

/// "gpu[07-09,12],cpu1" -> "gpu07": the first host of a Slurm node list.
std::string first_slurm_node(const std::string& node_list);
/// "2(x3),1" -> {2, 2, 2, 1}: Slurm's tasks per node, one entry per node.
std::vector<int> parse_slurm_tasks_per_node(const std::string& text);

/// The variables of this process's environment.
EnvLookup process_environment();

}  // namespace fsdp
