// fsdprun launcher core: spawns this node's ranks with a torchrun-style environment,
// relays their output line by line with a "[rankK]: " prefix, and supervises
// them (fail-fast on the first failing rank, restarts, signal forwarding).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fsdprun {

struct LaunchConfig {
  int nproc_per_node = 1;
  int nnodes = 1;     // static multi-node job: every node runs fsdprun with the same nnodes
  int node_rank = 0;  // in [0, nnodes - 1]; this node's ranks are node_rank * nproc_per_node + i
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port on master_addr (kStaticMasterPort if nnodes > 1)
  int max_restarts = 0;  // single node only: times all ranks are started again after a failure
  double grace_seconds = 5.0;  // SIGTERM -> SIGKILL escalation delay
  // --fault-tolerant F: ranks per replica (0: off). The store is served by fsdp_store_keeper (next
  // to fsdprun) instead of rank 0; a failed rank's replica alone is restarted while another
  // replica runs, else every rank is (docs/fault-tolerance.md).
  int fault_tolerant = 0;
  std::vector<std::string> command;  // PROGRAM followed by its arguments
};

// Thrown for problems the user must fix (bad program, no free port, ...);
// main() reports the message and exits with status 2.
struct UsageError {
  std::string message;
};

// torchrun's rendezvous port for a static multi-node launch: the nodes must agree on it, so it
// cannot be picked at random.
constexpr int kStaticMasterPort = 29500;

// Resolves PROGRAM like execvp would: a name containing '/' is used as is,
// otherwise it is searched in $PATH. Returns the executable's path, or
// nullopt if no executable regular file is found.
std::optional<std::string> resolve_program(const std::string& program);

// Binds a TCP socket to port 0 on `addr` and returns the port the kernel
// picked. Throws UsageError if that fails.
int find_free_port(const std::string& addr);

// The rendezvous port when none is given: a random free port below the kernel's ephemeral port
// range (so that no connection's local port can take it before rank 0 binds it), else
// find_free_port(addr).
int pick_master_port(const std::string& addr);

// Runs all ranks to completion, restarting them all up to max_restarts times after a failure,
// and returns fsdprun's exit status: 0 if every rank of an attempt exited 0, otherwise non-zero
// (see launcher.cpp).
// Throws UsageError for problems detected before any rank starts.
int launch(const LaunchConfig& config);

}  // namespace fsdprun
