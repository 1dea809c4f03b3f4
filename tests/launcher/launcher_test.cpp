// End-to-end tests of the fsdprun launcher: real processes, real signals.
// FSDPRUN_BIN (the fsdprun executable's path) is set by CMake.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef FSDPRUN_BIN
#error "FSDPRUN_BIN must be defined to the fsdprun executable's path"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A process counts as alive unless it is gone or a zombie (orphaned
// grandchildren may linger as zombies if PID 1 does not reap them).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

bool wait_until_dead(pid_t pid, double timeout_s) {
  auto start = Clock::now();
  while (process_alive(pid)) {
    if (seconds_since(start) > timeout_s) return false;
    sleep_ms(20);
  }
  return true;
}

// Scratch directory for output files and the PID files ranks write; any
// process still recorded there is killed on destruction so a failing test
// leaves nothing behind.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/fsdprun_test.XXXXXX";
    path_ = ::mkdtemp(templ.data()) ? templ : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~TempDir() {
    for (pid_t pid : recorded_pids()) ::kill(pid, SIGKILL);
    std::string cmd = "rm -rf '" + path_ + "'";
    if (!path_.empty()) (void)std::system(cmd.c_str());
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // PIDs written by the rank scripts into files named pid.*
  std::vector<pid_t> recorded_pids() const {
    std::vector<pid_t> pids;
    DIR* dir = ::opendir(path_.c_str());
    if (!dir) return pids;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.rfind("pid.", 0) == 0 && name.find(".tmp") == std::string::npos) {
        int pid = std::atoi(read_file(file(name)).c_str());
        if (pid > 0) pids.push_back(pid);
      }
    }
    ::closedir(dir);
    return pids;
  }

  bool wait_for_pids(size_t count, double timeout_s) const {
    auto start = Clock::now();
    while (recorded_pids().size() < count) {
      if (seconds_since(start) > timeout_s) return false;
      sleep_ms(20);
    }
    return true;
  }

 private:
  std::string path_;
};

// Variables of the environment that change what fsdprun does or what the ranks see; each test
// starts fsdprun without them (a test that wants one passes it explicitly).
const char* const kScrubbedVariables[] = {
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "PYTHONUNBUFFERED"};  // Python would flush every line without fsdprun's help

struct Result {
  int status = -1;  // raw wait status
  std::string out, err;
  double seconds = 0;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// fsdprun running in the background, stdout/stderr redirected to files.
class Fsdprun {
 public:
  Fsdprun(const TempDir& dir, const std::vector<std::string>& args, const Env& env = {})
      : out_path_(dir.file("fsdprun.out")), err_path_(dir.file("fsdprun.err")), start_(Clock::now()) {
    std::vector<std::string> argv{FSDPRUN_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      // The tests must not depend on what the caller exported: fsdprun keeps a user's
      // OMP_NUM_THREADS, and a launcher's variables would leak into the ranks' environment.
      for (const char* name : kScrubbedVariables) ::unsetenv(name);
      for (const auto& kv : env) ::setenv(kv.first.c_str(), kv.second.c_str(), 1);
      std::vector<char*> c_argv;
      for (auto& a : argv) c_argv.push_back(a.data());
      c_argv.push_back(nullptr);
      ::execv(c_argv[0], c_argv.data());
      ::_exit(126);
    }
  }
  ~Fsdprun() {
    if (!finished_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

  // Waits for exit; on timeout kills fsdprun and records a test failure.
  Result wait(double timeout_s = 30) {
    Result r;
    while (::waitpid(pid_, &r.status, WNOHANG) == 0) {
      if (seconds_since(start_) > timeout_s) {
        ADD_FAILURE() << "fsdprun did not exit within " << timeout_s << " s";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &r.status, 0);
        break;
      }
      sleep_ms(10);
    }
    finished_ = true;
    r.seconds = seconds_since(start_);
    r.out = read_file(out_path_);
    r.err = read_file(err_path_);
    return r;
  }

 private:
  std::string out_path_, err_path_;
  Clock::time_point start_;
  pid_t pid_ = -1;
  bool finished_ = false;
};

Result run_fsdprun(const std::vector<std::string>& args, const Env& env = {}) {
  TempDir dir;
  Fsdprun proc(dir, args, env);
  return proc.wait();
}

// Shell script for 3 ranks, run as `sh -c SCRIPT sh DIR F`: every rank except
// F records its PID in DIR/pid.RANK and sleeps 60 s; rank F first waits until
// the others have recorded their PIDs (so they are surely running), then runs
// the action given in the third argument via eval.
const char* kSleepersScript = R"(
D=$1; F=$2
if [ "$RANK" = "$F" ]; then
  for r in 0 1 2; do
    [ "$r" = "$F" ] && continue
    n=0; while [ ! -s "$D/pid.$r" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done
  done
  eval "$3"
fi
echo $$ > "$D/pid.$RANK.tmp" && mv "$D/pid.$RANK.tmp" "$D/pid.$RANK"
exec sleep 60
)";

std::vector<std::string> sleepers_command(const TempDir& dir, int failing_rank, const std::string& action) {
  return {"--nproc-per-node", "3", "--grace-seconds", "2", "sh", "-c", kSleepersScript, "sh", dir.path(),
          std::to_string(failing_rank), action};
}

void expect_all_dead(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) EXPECT_TRUE(wait_until_dead(pid, 3.0)) << "rank process " << pid << " survived";
}

// ---------------------------------------------------------------------------

TEST(Fsdprun, SetsTorchrunEnvironmentAndPrefixesLines) {
  Result r = run_fsdprun({"--nproc-per-node", "3", "sh", "-c",
                          "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT; "
                          "echo err$RANK >&2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;

  std::vector<std::string> out = lines_of(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  std::regex line_re(R"(\[rank(\d)\]: (\d) 3 (\d) 3 127\.0\.0\.1 (\d+))");
  std::set<int> ranks, ports;
  for (const std::string& line : out) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "unexpected line: " << line;
    EXPECT_EQ(m[1], m[2]) << line;  // prefix matches RANK
    EXPECT_EQ(m[2], m[3]) << line;  // LOCAL_RANK == RANK on one node
    ranks.insert(std::stoi(m[1]));
    ports.insert(std::stoi(m[4]));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  ASSERT_EQ(ports.size(), 1u) << "ranks disagree on MASTER_PORT";
  EXPECT_GT(*ports.begin(), 0);

  std::vector<std::string> err = lines_of(r.err);
  EXPECT_EQ(std::set<std::string>(err.begin(), err.end()),
            (std::set<std::string>{"[rank0]: err0", "[rank1]: err1", "[rank2]: err2"}))
      << r.err;
}

TEST(Fsdprun, FailingRankStopsTheOthers) {
  TempDir dir;
  Fsdprun proc(dir, sleepers_command(dir, 1, "exit 3"));
  Result r = proc.wait();
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_EQ(r.exit_code(), 3) << r.err;
  EXPECT_NE(r.err.find("fsdprun: rank 1 exited with status 3; stopped the other 2 ranks"), std::string::npos)
      << r.err;
  std::vector<pid_t> pids = dir.recorded_pids();
  EXPECT_EQ(pids.size(), 2u);
  expect_all_dead(pids);
}

TEST(Fsdprun, RankKilledBySignalIsReported) {
  TempDir dir;
  Fsdprun proc(dir, sleepers_command(dir, 0, "kill -9 $$"));
  Result r = proc.wait();
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_NE(r.err.find("fsdprun: rank 0 was killed by signal 9"), std::string::npos) << r.err;
  std::vector<pid_t> pids = dir.recorded_pids();
  EXPECT_EQ(pids.size(), 2u);
  expect_all_dead(pids);
}

TEST(Fsdprun, SigtermStopsAllRanksIncludingTheirChildren) {
  TempDir dir;
  // Each rank's sleep runs as a child of its shell, so stopping only the
  // shell would leave it behind.
  Fsdprun proc(dir, {"--nproc-per-node", "3", "sh", "-c",
                     "sleep 60 & echo $! > \"$1/pid.$RANK.tmp\" && mv \"$1/pid.$RANK.tmp\" \"$1/pid.$RANK\"; wait",
                     "sh", dir.path()});
  ASSERT_TRUE(dir.wait_for_pids(3, 10.0)) << "ranks did not start";
  ::kill(proc.pid(), SIGTERM);
  Result r = proc.wait();
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_FALSE(WIFSIGNALED(r.status)) << "fsdprun died from the signal instead of handling it";
  EXPECT_NE(r.err.find("fsdprun: received SIGTERM; stopped 3 ranks"), std::string::npos) << r.err;
  expect_all_dead(dir.recorded_pids());
}

TEST(Fsdprun, RanksDieWithALauncherKilledBySigkill) {
  TempDir dir;
  // exec: the rank's own process sleeps (a blocked rank: nothing it does will end it).
  Fsdprun proc(dir, {"--nproc-per-node", "2", "sh", "-c",
                     "echo $$ > \"$1/pid.$RANK.tmp\" && mv \"$1/pid.$RANK.tmp\" \"$1/pid.$RANK\" && exec sleep 60",
                     "sh", dir.path()});
  ASSERT_TRUE(dir.wait_for_pids(2, 10.0)) << "ranks did not start";
  ::kill(proc.pid(), SIGKILL);
  proc.wait();
  expect_all_dead(dir.recorded_pids());
}

TEST(Fsdprun, EscalatesToSigkillAfterGracePeriod) {
  TempDir dir;
  // The sleepers ignore SIGTERM; rank 1 fails, so only SIGKILL can stop them.
  std::vector<std::string> args = sleepers_command(dir, 1, "exit 4");
  args[3] = "1";  // --grace-seconds 1
  args[6] = std::string("trap '' TERM\n") + kSleepersScript;
  Fsdprun proc(dir, args);
  Result r = proc.wait();
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_EQ(r.exit_code(), 4) << r.err;
  EXPECT_NE(r.err.find("rank 1 exited with status 4"), std::string::npos) << r.err;
  expect_all_dead(dir.recorded_pids());
}

TEST(Fsdprun, BadUsageExitsWithStatus2) {
  TempDir dir;
  const std::string not_executable = dir.file("data.txt");
  std::ofstream(not_executable) << "not a program\n";
  ::chmod(not_executable.c_str(), 0644);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--nproc-per-node", "0", "true"}, "--nproc-per-node must be >= 1"},
      {{"--nproc-per-node", "2"}, "missing PROGRAM"},
      {{"--nproc-per-node", "2", "--"}, "missing PROGRAM"},
      {{"--nproc-per-node", "2", "fsdprun-no-such-program"}, "'fsdprun-no-such-program' not found"},
      {{"--nproc-per-node", "2", not_executable}, "'" + not_executable + "' not found or not executable"},
      {{"--nproc-per-node", "2", dir.path()}, "not found or not executable"},  // a directory
      {{"--nproc-per-node", "2", "--bogus", "true"}, "--bogus"},
      {{"true"}, "nproc-per-node"},
      {{"--nnodes", "2", "--node-rank", "2", "-n", "1", "true"}, "--node-rank must be in [0, 1]"},
      {{"--node_rank", "1", "-n", "1", "true"}, "--node-rank must be in [0, 0] with --nnodes 1"},
      {{"--nnodes", "0", "-n", "1", "true"}, "--nnodes must be in [1, "},
      {{"--nnodes", "two", "-n", "1", "true"}, "--nnodes must be a number of nodes"},
      {{"--nnodes", "1:2", "-n", "1", "true"}, "--nnodes 1:2 is an elastic range"},
      {{"--nnodes", "1:2", "-n", "1", "true"}, "torchrun's elastic agent"},
      {{"--max-restarts", "-1", "-n", "1", "true"}, "--max-restarts must be >= 0 (got -1)"},
      {{"--max-restarts", "1", "--nnodes", "2", "-n", "1", "true"}, "--max-restarts restarts the ranks of one node"},
      {{"--max_restarts", "1", "--nnodes", "2", "-n", "1", "true"}, "torchrun --nnodes 2 --max-restarts 1 --rdzv"},
  };
  for (const Case& c : cases) {
    Result r = run_fsdprun(c.args);
    EXPECT_EQ(r.exit_code(), 2) << "args[0..]: " << ::testing::PrintToString(c.args) << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(Fsdprun, PassesProgramArgumentsThroughUntouched) {
  const std::string print_args = "printf '<%s>' \"$@\"; echo";
  Result r = run_fsdprun({"--nproc-per-node", "1", "sh", "-c", print_args, "sh", "--steps", "3",
                          "--nproc-per-node", "5", "--", "-x"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank0]: <--steps><3><--nproc-per-node><5><--><-x>\n");

  r = run_fsdprun({"--nproc-per-node", "1", "--", "sh", "-c", print_args, "sh", "--steps", "3"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank0]: <--steps><3>\n");
}

TEST(Fsdprun, FlushesPartialLastLine) {
  Result r = run_fsdprun({"--nproc-per-node", "2", "sh", "-c", "printf 'a\\nno newline'; printf 'e' >&2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::vector<std::string> out = lines_of(r.out);
  EXPECT_EQ(std::set<std::string>(out.begin(), out.end()),
            (std::set<std::string>{"[rank0]: a", "[rank0]: no newline", "[rank1]: a", "[rank1]: no newline"}));
  EXPECT_EQ(out.size(), 4u);
  EXPECT_EQ(r.err.size(), 2 * std::string("[rankK]: e\n").size()) << r.err;
}

TEST(Fsdprun, LinesOfConcurrentRanksDoNotInterleave) {
  // 4 ranks x 3000 lines of ~250 bytes each, written as fast as sh can.
  Result r = run_fsdprun({"--nproc-per-node", "4", "sh", "-c",
                          "x=$(printf '%0240d' 0); i=0; while [ $i -lt 3000 ]; do echo \"r$RANK $i $x\"; "
                          "i=$((i+1)); done"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::vector<std::string> out = lines_of(r.out);
  EXPECT_EQ(out.size(), 4u * 3000u);
  std::regex line_re(R"(\[rank(\d)\]: r(\d) (\d+) 0{240})");
  int next[4] = {0, 0, 0, 0};
  for (const std::string& line : out) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mangled line: " << line.substr(0, 300);
    ASSERT_EQ(m[1], m[2]);
    int rank = std::stoi(m[1]);
    ASSERT_EQ(std::stoi(m[3]), next[rank]++) << "lines of rank " << rank << " out of order";
  }
}

TEST(Fsdprun, HonoursMasterOptionsAndOmpThreads) {
  Result r = run_fsdprun({"--nproc-per-node", "2", "--master-addr", "localhost", "--master-port", "29517", "sh",
                          "-c", "echo $MASTER_ADDR:$MASTER_PORT $OMP_NUM_THREADS"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  int expected_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
  std::string expected = "localhost:29517 " + std::to_string(expected_threads);
  std::vector<std::string> out = lines_of(r.out);
  EXPECT_EQ(out.size(), 2u) << r.out;
  EXPECT_EQ(std::set<std::string>(out.begin(), out.end()),
            (std::set<std::string>{"[rank0]: " + expected, "[rank1]: " + expected}))
      << r.out;

  // A user-provided OMP_NUM_THREADS wins.
  r = run_fsdprun({"--nproc-per-node", "1", "sh", "-c", "echo $OMP_NUM_THREADS"}, {{"OMP_NUM_THREADS", "7"}});
  EXPECT_EQ(r.out, "[rank0]: 7\n");
}

TEST(Fsdprun, SecondNodeRanksGetGlobalRanksAndNodeVariables) {
  Result r = run_fsdprun({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                          "--master-port", "29533", "sh", "-c",
                          "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE "
                          "$ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME $MASTER_ADDR:$MASTER_PORT"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::vector<std::string> out = lines_of(r.out);
  EXPECT_EQ(out.size(), 2u) << r.out;
  EXPECT_EQ(std::set<std::string>(out.begin(), out.end()),
            (std::set<std::string>{"[rank2]: 2 0 4 2 1 2 2 4 default 127.0.0.1:29533",
                                   "[rank3]: 3 1 4 2 1 2 3 4 default 127.0.0.1:29533"}))
      << r.out;
}

TEST(Fsdprun, SecondNodeFailureNamesTheGlobalRank) {
  Result r = run_fsdprun({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", "29533",
                          "sh", "-c", "[ $LOCAL_RANK = 1 ] && exit 5; exec sleep 60"});
  EXPECT_EQ(r.exit_code(), 5) << r.err;
  EXPECT_NE(r.err.find("fsdprun: rank 3 exited with status 5; stopped the other 1 rank"), std::string::npos) << r.err;
}

TEST(Fsdprun, MultiNodeDefaultsToTorchrunsStaticPortWithoutBindingTheMasterAddress) {
  // The nodes must agree on the port, so it is not random; on all nodes but node 0 the master
  // address is another host's (here TEST-NET-1, which no interface has), so nothing binds it.
  Result r = run_fsdprun({"--nnodes", "2:2", "--node_rank", "1", "--nproc-per-node", "1", "--master-addr",
                          "192.0.2.1", "sh", "-c", "echo $MASTER_ADDR:$MASTER_PORT $RANK"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank1]: 192.0.2.1:29500 1\n");
}

TEST(Fsdprun, DefaultMasterPortIsFreshPerRun) {
  // Two concurrent launches must not be handed the same rendezvous port.
  TempDir a, b;
  std::vector<std::string> args = {"--nproc-per-node", "1", "sh", "-c", "echo $MASTER_PORT; sleep 1"};
  Fsdprun first(a, args), second(b, args);
  Result ra = first.wait(), rb = second.wait();
  ASSERT_EQ(ra.exit_code(), 0) << ra.err;
  ASSERT_EQ(rb.exit_code(), 0) << rb.err;
  EXPECT_NE(ra.out, rb.out);
}

// ---------------------------------------------------------------------------
// --max-restarts

// Appends the rank's "TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS MASTER_PORT" to
// $1/attempts.RANK, one line per attempt the rank was started in.
const std::string kRecordAttempt =
    "echo $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $MASTER_PORT >> \"$1/attempts.$RANK\"\n";

std::vector<std::string> attempts_of(const TempDir& dir, int rank) {
  return lines_of(read_file(dir.file("attempts." + std::to_string(rank))));
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(Fsdprun, RestartsAllRanksAfterAFailure) {
  TempDir dir;
  // The first attempt fails once both ranks have recorded it (so fail-fast cannot stop one
  // before it did); the second succeeds.
  const std::string script = kRecordAttempt + R"sh(
[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ] && exit 0
n=0; while [ "$(cat "$1"/attempts.* 2>/dev/null | wc -l)" -lt 2 ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done
exit 3
)sh";
  Fsdprun proc(dir, {"--max-restarts", "2", "--nproc-per-node", "2", "sh", "-c", script, "sh", dir.path()});
  Result r = proc.wait();
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(fsdprun: rank [01] failed \(exit 3\); restarting all ranks \(attempt 2 of 3\)\n)")))
      << r.err;
  EXPECT_EQ(count_of(r.err, "restarting"), 1u) << r.err;
  for (int rank : {0, 1}) {
    std::vector<std::string> attempts = attempts_of(dir, rank);
    ASSERT_EQ(attempts.size(), 2u) << "rank " << rank << ": " << ::testing::PrintToString(attempts);
    EXPECT_EQ(attempts[0].substr(0, 4), "0 2 ") << "rank " << rank;
    EXPECT_EQ(attempts[1].substr(0, 4), "1 2 ") << "rank " << rank;
    EXPECT_EQ(attempts[0].substr(4), attempts[1].substr(4)) << "MASTER_PORT changed across attempts";
  }
}

// --fault-tolerant 2 over 4 ranks: rank 3's first start fails (its replica's other rank then
// exits as gpt_train's would, status 75); only replica 1 (ranks 2, 3) starts again, as
// incarnation 1, while ranks 0 and 1 run on until the replacement has started.
TEST(Fsdprun, FaultTolerantRestartsOnlyTheLostReplica) {
  const std::string bin = FSDPRUN_BIN;
  if (::access((bin.substr(0, bin.rfind('/') + 1) + "fsdp_store_keeper").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "fsdp_store_keeper (built with LibTorch) is not next to fsdprun";
  }
  TempDir dir;
  const std::string script = R"sh(
echo "$FSDP_REPLICA_INCARNATION $TORCHELASTIC_USE_AGENT_STORE" >> "$1/starts.$RANK"
wait_for_starts() { n=0; while [ "$(cat "$1"/starts.* | wc -l)" -lt "$2" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done; }
if [ "$FSDP_REPLICA_INCARNATION" = 0 ] && [ "$RANK" -ge 2 ]; then
  wait_for_starts "$1" 4
  [ "$RANK" = 3 ] && exit 3
  sleep 0.3; exit 75
fi
wait_for_starts "$1" 6
)sh";
  Fsdprun proc(dir, {"--max-restarts", "2", "--fault-tolerant", "2", "--nproc-per-node", "4", "sh", "-c", script,
                     "sh", dir.path()});
  Result r = proc.wait();
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(count_of(r.err, "fsdprun: replica 1 (ranks 2-3) lost rank 3 (exit 3); starting it again "
                            "(incarnation 1, restart 1 of 2) while the other replicas train"), 1u) << r.err;
  EXPECT_EQ(count_of(r.err, "restarting all ranks"), 0u) << r.err;
  for (int rank : {0, 1}) {
    EXPECT_EQ(lines_of(read_file(dir.file("starts." + std::to_string(rank)))),
              std::vector<std::string>({"0 True"})) << "rank " << rank;
  }
  for (int rank : {2, 3}) {
    EXPECT_EQ(lines_of(read_file(dir.file("starts." + std::to_string(rank)))),
              std::vector<std::string>({"0 True", "1 True"})) << "rank " << rank;
  }
}

// Runs a single rank that always fails with status 3 and returns the attempts it recorded.
std::vector<std::string> attempts_of_always_failing_rank(const std::vector<std::string>& restart_args, Result* r) {
  TempDir dir;
  std::vector<std::string> args = restart_args;
  for (const char* arg : {"--nproc-per-node", "1", "sh", "-c"}) args.push_back(arg);
  args.insert(args.end(), {kRecordAttempt + "exit 3", "sh", dir.path()});
  Fsdprun proc(dir, args);
  *r = proc.wait();
  return attempts_of(dir, 0);
}

TEST(Fsdprun, GivesUpAfterMaxRestarts) {
  Result r;
  std::vector<std::string> attempts = attempts_of_always_failing_rank({"--max-restarts", "2"}, &r);
  EXPECT_EQ(r.exit_code(), 3) << r.err;
  ASSERT_EQ(attempts.size(), 3u) << ::testing::PrintToString(attempts);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(attempts[i].substr(0, 4), std::to_string(i) + " 2 ");
  EXPECT_EQ(count_of(r.err, "fsdprun: rank 0 failed (exit 3); restarting all ranks (attempt 2 of 3)"), 1u) << r.err;
  EXPECT_EQ(count_of(r.err, "fsdprun: rank 0 failed (exit 3); restarting all ranks (attempt 3 of 3)"), 1u) << r.err;
  EXPECT_EQ(count_of(r.err, "restarting"), 2u) << r.err;
  EXPECT_NE(r.err.find("fsdprun: rank 0 exited with status 3; no other ranks were running"), std::string::npos)
      << r.err;
}

TEST(Fsdprun, NoRestartByDefault) {
  Result r;
  std::vector<std::string> attempts = attempts_of_always_failing_rank({}, &r);
  EXPECT_EQ(r.exit_code(), 3) << r.err;
  ASSERT_EQ(attempts.size(), 1u) << ::testing::PrintToString(attempts);
  EXPECT_EQ(attempts[0].substr(0, 4), "0 0 ");
  EXPECT_EQ(count_of(r.err, "restarting"), 0u) << r.err;
}

TEST(Fsdprun, SigtermDuringAnAttemptDoesNotRestart) {
  TempDir dir;
  Fsdprun proc(dir, {"--max-restarts", "2", "--nproc-per-node", "2", "sh", "-c",
                     kRecordAttempt + "echo $$ > \"$1/pid.$RANK.tmp\" && mv \"$1/pid.$RANK.tmp\" \"$1/pid.$RANK\"\n"
                                      "exec sleep 60",
                     "sh", dir.path()});
  ASSERT_TRUE(dir.wait_for_pids(2, 10.0)) << "ranks did not start";
  ::kill(proc.pid(), SIGTERM);
  Result r = proc.wait();
  EXPECT_EQ(r.exit_code(), 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("fsdprun: received SIGTERM; stopped 2 ranks"), std::string::npos) << r.err;
  EXPECT_EQ(count_of(r.err, "restarting"), 0u) << r.err;
  for (int rank : {0, 1}) EXPECT_EQ(attempts_of(dir, rank).size(), 1u) << "rank " << rank;
  expect_all_dead(dir.recorded_pids());
}

TEST(Fsdprun, SigtermWhileAFailedAttemptStopsDoesNotRestart) {
  TempDir dir;
  // Rank 1 fails; the others ignore SIGTERM, so the attempt takes the grace period (2 s) to end,
  // and fsdprun gets its SIGTERM meanwhile.
  std::vector<std::string> args = sleepers_command(dir, 1, "touch \"$D/failed\"; exit 4");
  args[6] = std::string("trap '' TERM\n") + kSleepersScript;
  args.insert(args.begin(), {"--max-restarts", "2"});
  Fsdprun proc(dir, args);
  for (auto start = Clock::now(); ::access(dir.file("failed").c_str(), F_OK) != 0 && seconds_since(start) < 10;) {
    sleep_ms(20);
  }
  sleep_ms(300);
  ::kill(proc.pid(), SIGTERM);
  Result r = proc.wait();
  EXPECT_EQ(r.exit_code(), 4) << r.err;
  EXPECT_NE(r.err.find("fsdprun: rank 1 exited with status 4"), std::string::npos) << r.err;
  EXPECT_EQ(count_of(r.err, "restarting"), 0u) << r.err;
  expect_all_dead(dir.recorded_pids());
}

}  // namespace

// ---------------------------------------------------------------------------
// Output as it comes: a rank's stdout reaches fsdprun's line by line, however the rank writes it
// (the C library and Python buffer whole blocks when stdout is a pipe). The rank prints a line
// and waits for a file the test creates only once it has seen the line: no timing involved.

#ifndef LINE_BUFFER_PROBE
#error "LINE_BUFFER_PROBE must be defined to the line_buffer_probe executable's path"
#endif

namespace {

// Runs `rank_command` (which must print "first line", wait for the file GO, named by its last
// argument, and print "saw go" if it came) under fsdprun and creates GO once the line arrived.
void expect_line_relayed_before_exit(std::vector<std::string> rank_command) {
  TempDir dir;
  const std::string go = dir.file("go");
  rank_command.push_back(go);
  std::vector<std::string> args{"--nproc-per-node", "1"};
  args.insert(args.end(), rank_command.begin(), rank_command.end());
  Fsdprun proc(dir, args);
  // Bounded only against a broken launcher: the rank gives up waiting for GO after 60 s.
  const auto start = Clock::now();
  while (read_file(dir.file("fsdprun.out")).find("[rank0]: first line\n") == std::string::npos &&
         seconds_since(start) < 90) {
    sleep_ms(20);
  }
  std::ofstream(go) << "go\n";
  Result r = proc.wait(120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank0]: first line\n[rank0]: saw go\n")
      << "the rank's first line reached fsdprun only when the rank exited: its stdout is buffered";
}

TEST(Fsdprun, RelaysPrintfOutputAsItComes) { expect_line_relayed_before_exit({LINE_BUFFER_PROBE, "printf"}); }

TEST(Fsdprun, RelaysCoutOutputAsItComes) { expect_line_relayed_before_exit({LINE_BUFFER_PROBE, "cout"}); }

TEST(Fsdprun, RelaysPythonPrintAsItComes) {
  expect_line_relayed_before_exit(
      {FSDPRUN_TEST_PYTHON, "-c",
       "import os, sys, time\n"
       "print('first line')\n"
       "deadline = time.time() + 60\n"
       "while not os.path.exists(sys.argv[1]) and time.time() < deadline: time.sleep(0.05)\n"
       "print('saw go' if os.path.exists(sys.argv[1]) else 'no go')\n"});
}

}  // namespace
