// fsdprun: torchrun-like launcher for fsdp-cpp programs: starts this node's ranks, on one node
// or as node K of a static multi-node job (the same command on every node, each with its own
// --node-rank), and on one node restarts them all after a failure if asked to.
//
//   fsdprun --nproc-per-node N [--nnodes M --node-rank K] [--master-addr A] [--master-port P]
//           [--max-restarts R] [--grace-seconds S] [--] PROGRAM ARGS...
//
// Everything from PROGRAM on is passed to the program untouched. Elastic jobs (--nnodes MIN:MAX,
// restarts across nodes) are torchrun's elastic agent's business.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "launcher.h"

namespace {

constexpr int kUsageExit = 2;
constexpr double kMaxGraceSeconds = 86400;  // a day: longer is a typo, and must fit poll()'s int ms
constexpr int kMaxRanks = 4096;             // fork()s on one node; more is a typo, not a job
constexpr int kMaxNodes = 65536;            // more is a typo; also keeps WORLD_SIZE within an int

int usage_error(const std::string& message) {
  std::cerr << "fsdprun: error: " << message << "\n"
            << "usage: fsdprun --nproc-per-node N [--nnodes M --node-rank K] [--master-addr A] "
               "[--master-port P] [--max-restarts R] [--fault-tolerant F] [--grace-seconds S] [--] PROGRAM "
               "[ARGS...]\n";
  return kUsageExit;
}

// CLI11 with prefix_command() stops at the first positional (PROGRAM) and
// leaves it and everything after it in remaining(). A leading "--" also ends
// up there; an unknown fsdprun option before PROGRAM does too, which we
// reject rather than mistake for the program.
std::vector<std::string> extract_command(const CLI::App& app, std::string* error) {
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    *error = "unknown option '" + rest.front() + "' (use '--' before a PROGRAM starting with '-')";
    return {};
  }
  if (rest.empty()) *error = "missing PROGRAM to launch";
  return rest;
}

// Parses torchrun's --nnodes: N, or an elastic range MIN:MAX that only a static launch with
// MIN == MAX can honour. Returns 0 and sets *error if the value is not a node count.
int parse_nnodes(const std::string& text, std::string* error) {
  const size_t colon = text.find(':');
  const std::string min_text = text.substr(0, colon);
  const std::string max_text = colon == std::string::npos ? min_text : text.substr(colon + 1);
  char* min_end = nullptr;
  char* max_end = nullptr;
  const long min = std::strtol(min_text.c_str(), &min_end, 10);
  const long max = std::strtol(max_text.c_str(), &max_end, 10);
  const bool numbers = !min_text.empty() && !max_text.empty() && *min_end == '\0' && *max_end == '\0';
  if (!numbers) {
    *error = "--nnodes must be a number of nodes N (or N:N), got '" + text + "'";
  } else if (min != max) {
    *error = "--nnodes " + text + " is an elastic range, which fsdprun does not run; use a fixed --nnodes N, "
             "or torchrun's elastic agent for elastic ranges (torchrun --nnodes " + text +
             " --rdzv-backend c10d --rdzv-endpoint HOST:PORT --no-python PROGRAM)";
  } else if (min < 1 || min > kMaxNodes) {
    *error = "--nnodes must be in [1, " + std::to_string(kMaxNodes) + "], got '" + text + "'";
  }
  return error->empty() ? static_cast<int>(min) : 0;
}

// Checks what the parser cannot: the flags' ranges and how they go together.
std::string check_layout(const fsdprun::LaunchConfig& config) {
  const std::string nnodes = std::to_string(config.nnodes);
  if (config.node_rank < 0 || config.node_rank >= config.nnodes) {
    return "--node-rank must be in [0, " + std::to_string(config.nnodes - 1) + "] with --nnodes " + nnodes +
           " (got " + std::to_string(config.node_rank) + ")";
  }
  if (config.max_restarts < 0) {
    return "--max-restarts must be >= 0 (got " + std::to_string(config.max_restarts) + ")";
  }
  if (config.max_restarts > 0 && config.nnodes > 1) {
    // A restart must restart every node's ranks, which takes an agent that talks to the others.
    return "--max-restarts restarts the ranks of one node only (--nnodes 1); for restarts across nodes use "
           "torchrun's elastic agent, e.g. torchrun --nnodes " + nnodes + " --max-restarts " +
           std::to_string(config.max_restarts) +
           " --rdzv-backend c10d --rdzv-endpoint HOST:PORT --no-python PROGRAM";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  fsdprun::LaunchConfig config;
  int nproc = 0;
  std::string nnodes = "1";

  CLI::App app{"fsdprun: start N local ranks of PROGRAM with a torchrun-style environment, on one node or "
               "as one node of a static multi-node job"};
  app.prefix_command();
  app.footer(
      "PROGRAM [ARGS...] follows the options (optionally after '--') and is passed through untouched.\n"
      "Each rank gets RANK (= node rank * N + LOCAL_RANK), LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
      "GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,\n"
      "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and (unless set) OMP_NUM_THREADS;\n"
      "its output is prefixed '[rankK]: ' with its global rank.\n"
      "Multi-node: run the same command on every node with --nnodes M, its own --node-rank and\n"
      "--master-addr set to node 0's address.");
  app.add_option("--nproc-per-node,--nproc_per_node,-n", nproc, "number of ranks to start")
      ->required();
  app.add_option("--nnodes", nnodes, "number of nodes (torchrun's MIN:MAX only as N:N)")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", config.node_rank, "this node's rank, in [0, nnodes - 1]")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", config.master_addr, "rendezvous address (node 0's)")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", config.master_port,
                 "rendezvous port (default: a free port on the master address; with --nnodes > 1, " +
                     std::to_string(fsdprun::kStaticMasterPort) + " as torchrun, since all nodes must agree)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--max-restarts,--max_restarts", config.max_restarts,
                 "times to restart all ranks after a rank fails (single node only)")
      ->capture_default_str();
  app.add_option("--fault-tolerant", config.fault_tolerant,
                 "F: the program runs replicas of F ranks (gpt_train --strategy hybrid --fault-tolerant "
                 "--shard-group-size F); a failed rank restarts only its replica while another runs "
                 "(single node; the store is served by fsdp_store_keeper)")
      ->check(CLI::Range(1, kMaxRanks));
  app.add_option("--grace-seconds", config.grace_seconds,
                 "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            const bool number = !text.empty() && end == text.c_str() + text.size();
            if (number && std::isfinite(value) && value >= 0 && value <= kMaxGraceSeconds) return "";
            return "must be a number of seconds in [0, " + std::to_string(int(kMaxGraceSeconds)) +
                   "], got '" + text + "'";
          },
          "SECONDS", "grace"));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }

  if (nproc < 1) return usage_error("--nproc-per-node must be >= 1 (got " + std::to_string(nproc) + ")");
  if (nproc > kMaxRanks) {
    return usage_error("--nproc-per-node must be <= " + std::to_string(kMaxRanks) + " (got " +
                       std::to_string(nproc) + ")");
  }
  config.nproc_per_node = nproc;

  std::string error;
  config.nnodes = parse_nnodes(nnodes, &error);
  if (error.empty()) error = check_layout(config);
  if (!error.empty()) return usage_error(error);

  config.command = extract_command(app, &error);
  if (!error.empty()) return usage_error(error);

  try {
    return fsdprun::launch(config);
  } catch (const fsdprun::UsageError& e) {
    return usage_error(e.message);
  }
}
