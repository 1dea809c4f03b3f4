// fsdprun launcher core: spawns local ranks with a torchrun-style environment,
// relays their output line by line with a "[rankK]: " prefix, and supervises
// them (fail-fast on the first failing rank, signal forwarding).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fsdprun {

struct LaunchConfig {
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port on master_addr
  double grace_seconds = 5.0;  // SIGTERM -> SIGKILL escalation delay
  std::vector<std::string> command;  // PROGRAM followed by its arguments
};

// Thrown for problems the user must fix (bad program, no free port, ...);
// main() reports the message and exits with status 2.
struct UsageError {
  std::string message;
};

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

// Runs all ranks to completion and returns fsdprun's exit status:
// 0 if every rank exited 0, otherwise non-zero (see launcher.cpp).
// Throws UsageError for problems detected before any rank starts.
int launch(const LaunchConfig& config);

}  // namespace fsdprun
