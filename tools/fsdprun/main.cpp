// fsdprun: torchrun-like launcher for fsdp-cpp programs on a single node.
//
//   fsdprun --nproc-per-node N [--master-addr A] [--master-port P]
//           [--grace-seconds S] [--] PROGRAM ARGS...
//
// Everything from PROGRAM on is passed to the program untouched.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "launcher.h"

namespace {

constexpr int kUsageExit = 2;
constexpr double kMaxGraceSeconds = 86400;  // a day: longer is a typo, and must fit poll()'s int ms
constexpr int kMaxRanks = 4096;             // fork()s on one node; more is a typo, not a job

int usage_error(const std::string& message) {
  std::cerr << "fsdprun: error: " << message << "\n"
            << "usage: fsdprun --nproc-per-node N [--master-addr A] [--master-port P] "
               "[--grace-seconds S] [--] PROGRAM [ARGS...]\n";
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

}  // namespace

int main(int argc, char** argv) {
  fsdprun::LaunchConfig config;
  int nproc = 0;

  CLI::App app{"fsdprun: start N local ranks of PROGRAM with a torchrun-style environment"};
  app.prefix_command();
  app.footer(
      "PROGRAM [ARGS...] follows the options (optionally after '--') and is passed through untouched.\n"
      "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,\n"
      "MASTER_ADDR, MASTER_PORT and (unless set) OMP_NUM_THREADS; its output is prefixed '[rankK]: '.");
  app.add_option("--nproc-per-node,--nproc_per_node,-n", nproc, "number of ranks to start")
      ->required();
  app.add_option("--master-addr,--master_addr", config.master_addr, "rendezvous address")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", config.master_port,
                 "rendezvous port (default: a free port on the master address)")
      ->check(CLI::Range(1, 65535));
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
  config.command = extract_command(app, &error);
  if (!error.empty()) return usage_error(error);

  try {
    return fsdprun::launch(config);
  } catch (const fsdprun::UsageError& e) {
    return usage_error(e.message);
  }
}
