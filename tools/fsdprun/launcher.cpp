#include "launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <map>
#include <set>
#include <thread>

extern char** environ;

namespace fsdprun {
namespace {

// A rank that never prints a newline still gets its output relayed, in
// chunks of this size.
constexpr size_t kMaxLineBytes = 64 * 1024;

// ---------------------------------------------------------------------------
// Small syscall helpers

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Writes everything, retrying on EINTR. Errors (e.g. our own stdout closed)
// are ignored: the ranks must still be supervised.
void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

bool is_executable_file(const std::string& path) {
  struct stat st;
  // access() alone is not enough: for root, X_OK succeeds on directories.
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// ---------------------------------------------------------------------------
// Signals: handlers only write the signal number into a self-pipe, which the
// poll() loop watches. SIGCHLD goes through it too so that a rank exiting
// wakes the loop even when it printed nothing.

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

const int kHandledSignals[] = {SIGINT, SIGTERM, SIGCHLD};

void install_signal_handlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw UsageError{std::string("pipe: ") + std::strerror(errno)};
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : kHandledSignals) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor
}

sigset_t handled_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kHandledSignals) sigaddset(&set, sig);
  return set;
}

// ---------------------------------------------------------------------------
// Output relay: each rank's stdout/stderr pipe is split into lines, each line
// written with one write() so lines of different ranks never interleave.

struct Stream {
  int fd = -1;      // read end of the rank's pipe; -1 once closed
  int out_fd = 1;   // where prefixed lines go (1 or 2)
  std::string pending;  // bytes after the last newline
};

void emit_complete_lines(Stream& s, const std::string& prefix) {
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    write_all(s.out_fd, prefix + s.pending.substr(start, nl - start + 1));
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= kMaxLineBytes) {
    write_all(s.out_fd, prefix + s.pending + "\n");
    s.pending.clear();
  }
}

void close_stream(Stream& s, const std::string& prefix) {
  if (s.fd < 0) return;
  if (!s.pending.empty()) write_all(s.out_fd, prefix + s.pending + "\n");
  s.pending.clear();
  ::close(s.fd);
  s.fd = -1;
}

// Reads whatever is available without blocking; closes the stream on EOF.
void pump_stream(Stream& s, const std::string& prefix) {
  char buf[16384];
  while (s.fd >= 0) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<size_t>(n));
      emit_complete_lines(s, prefix);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      close_stream(s, prefix);  // EOF or read error
    }
  }
}

// ---------------------------------------------------------------------------
// Rank environment and spawning

struct Rank {
  int local_rank = 0;   // LOCAL_RANK, the index in the attempt's ranks
  int global_rank = 0;  // RANK
  std::string prefix;   // "[rankK]: " with the global rank
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  Stream out, err;
};

int global_rank(const LaunchConfig& cfg, int local_rank) { return cfg.node_rank * cfg.nproc_per_node + local_rank; }

// The variables torchrun's agent sets (one role, "default", so ROLE_* equal the global ones).
std::vector<std::string> rank_environment(const LaunchConfig& cfg, int local_rank, int port, int restart_count,
                                          int incarnation = 0) {
  const std::string rank = std::to_string(global_rank(cfg, local_rank));
  const std::string world_size = std::to_string(cfg.nnodes * cfg.nproc_per_node);
  std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", world_size},
      {"LOCAL_WORLD_SIZE", std::to_string(cfg.nproc_per_node)},
      {"GROUP_RANK", std::to_string(cfg.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(cfg.nnodes)},
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", world_size},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", cfg.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(cfg.max_restarts)},
  };
  if (cfg.fault_tolerant > 0) {
    vars.emplace_back("TORCHELASTIC_USE_AGENT_STORE", "True");  // the keeper serves it, not rank 0
    vars.emplace_back("FSDP_REPLICA_INCARNATION", std::to_string(incarnation));
  }
  // Split the cores between the ranks unless the user chose a value.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    vars.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1, cores / cfg.nproc_per_node)));
  }

  std::set<std::string> overridden;
  for (const auto& kv : vars) overridden.insert(kv.first);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    if (overridden.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& kv : vars) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Runs in the child between fork() and exec(): only async-signal-safe calls.
[[noreturn]] void exec_rank(const char* path, char** argv, char** envp, int out_w, int err_w,
                            const sigset_t& old_mask, pid_t launcher) {
  ::setpgid(0, 0);  // own process group, so stopping a rank stops its children too
  // A launcher killed by SIGKILL cannot stop its ranks: the kernel does it (the rank itself; a
  // rank's own children are its business). The check closes the race with a launcher that died
  // before prctl.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(128 + SIGKILL);
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, 0);
  ::dup2(out_w, 1);
  ::dup2(err_w, 2);
  for (int sig : kHandledSignals) ::signal(sig, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::execve(path, argv, envp);
  // Rare (the program was checked before forking), e.g. a bad ELF or script
  // interpreter. The parent is single-threaded, so strerror() is safe here.
  const char* parts[] = {"fsdprun: cannot execute ", path, ": ", std::strerror(errno), "\n"};
  for (const char* part : parts) {
    ssize_t ignored = ::write(2, part, std::strlen(part));
    (void)ignored;
  }
  ::_exit(127);
}

// A rank's stdout: the slave side of a pseudo-terminal, so that the C library, std::cout and
// Python see a terminal and flush every line (through a pipe they buffer blocks, and a run's
// output would appear only at exit). Output processing is off: "\n" stays "\n", not "\r\n".
// Falls back to a pipe where no pseudo-terminal can be had. fds[0]: read end, fds[1]: write end.
void open_stdout_channel(int fds[2]) {
  termios raw_output{};
  cfmakeraw(&raw_output);
  if (::openpty(&fds[0], &fds[1], nullptr, &raw_output, nullptr) == 0) {
    ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    ::fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    return;
  }
  if (::pipe2(fds, O_CLOEXEC) != 0) throw UsageError{std::string("pipe: ") + std::strerror(errno)};
}

// Starts one rank with its stdout on a fresh pseudo-terminal and its stderr on a fresh pipe
// (stderr is unbuffered anyway).
void spawn_rank(Rank& rank, const std::string& path, std::vector<std::string> argv,
                std::vector<std::string> env) {
  int out_pipe[2], err_pipe[2];
  open_stdout_channel(out_pipe);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw UsageError{std::string("pipe: ") + std::strerror(errno)};
  }
  std::vector<char*> c_argv = c_strings(argv);
  std::vector<char*> c_env = c_strings(env);

  // Block our handled signals across fork so the child cannot run our
  // handlers (which would write into the parent's self-pipe) before exec.
  sigset_t block = handled_signal_set(), old_mask;
  ::sigprocmask(SIG_BLOCK, &block, &old_mask);
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    exec_rank(path.c_str(), c_argv.data(), c_env.data(), out_pipe[1], err_pipe[1], old_mask, launcher);
  }
  int fork_errno = errno;
  if (pid > 0) ::setpgid(pid, pid);  // also here, to avoid racing the child
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);

  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw UsageError{std::string("fork: ") + std::strerror(fork_errno)};
  }
  rank.pid = pid;
  rank.running = true;
  rank.out = Stream{out_pipe[0], 1, {}};
  rank.err = Stream{err_pipe[0], 2, {}};
  set_nonblocking(rank.out.fd);
  set_nonblocking(rank.err.fd);
}

std::string describe_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(wait_status)) + " (" +
           signal_name(WTERMSIG(wait_status)) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
}

// The restart line's short form of describe_status(): "exit 3" or "SIGKILL".
std::string short_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) return signal_name(WTERMSIG(wait_status));
  return "exit " + std::to_string(WEXITSTATUS(wait_status));
}

bool succeeded(int wait_status) { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

std::string plural_ranks(int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

// ---------------------------------------------------------------------------
// Supervision

class Supervisor {
 public:
  Supervisor(const LaunchConfig& cfg, std::string program_path, int port)
      : cfg_(cfg), program_path_(std::move(program_path)), port_(port) {}

  int run() {
    install_signal_handlers();
    for (int restart_count = 0;; ++restart_count) {
      run_attempt(restart_count);
      if (!should_restart(restart_count)) return report();
      announce_restart(restart_count + 1);
    }
  }

 private:
  // State of one attempt; a restart begins with a fresh one.
  struct Attempt {
    std::vector<Rank> ranks;
    std::optional<int> failed_rank;  // local rank of the first rank that failed on its own
    int stopped_count = 0;           // ranks still running when shutdown began
    double kill_deadline = 0;        // when survivors get SIGKILL; 0 = not armed
    bool killed = false;
  };

  void run_attempt(int restart_count) {
    attempt_ = Attempt{};
    restart_count_ = restart_count;
    lost_replicas_.clear();
    incarnations_.clear();
    start_ranks(restart_count);
    while (live_count() > 0 || !lost_replicas_.empty()) {
      wait_for_events();
      handle_signals();
      reap_children();
      replace_lost_replicas();
      enforce_kill_deadline();
    }
  }

  // A failed attempt is retried while restarts remain, unless fsdprun itself was told to stop.
  bool should_restart(int) {
    if (!attempt_.failed_rank || restarts_used_ >= cfg_.max_restarts) return false;
    handle_signals();  // a SIGTERM that arrived with the last rank's exit counts too
    if (received_signal_ != 0) return false;
    ++restarts_used_;
    return true;
  }

  // [Note: replicas that survive a lost peer] (--fault-tolerant F)
  // A rank that fails loses its replica (ranks F*r .. F*r+F-1): the replica's other ranks are
  // killed, and once all have exited the replica is started again (FSDP_REPLICA_INCARNATION + 1)
  // while another replica runs on; its ranks join that one at a step boundary. When no replica
  // is left whole (each lost a rank), the attempt fails as without the flag: every rank restarts
  // (from the checkpoint).
  int replica_of(const Rank& r) const { return r.local_rank / cfg_.fault_tolerant; }

  bool replica_running_whole(int replica) const {
    for (const Rank& r : attempt_.ranks) {
      if (replica_of(r) == replica && !r.running) return false;
    }
    return true;
  }

  bool replica_finished(int replica) const {
    for (const Rank& r : attempt_.ranks) {
      if (replica_of(r) == replica && (r.running || !succeeded(r.wait_status))) return false;
    }
    return true;
  }

  bool replica_exited(int replica) const {
    for (const Rank& r : attempt_.ranks) {
      if (replica_of(r) == replica && r.running) return false;
    }
    return true;
  }

  // The replica's other ranks find the loss in their own collectives and tell the quorum before
  // they exit (which spares the survivors the vote timeout); after --grace-seconds they are killed.
  void lose_replica(const Rank& failed) {
    const int replica = replica_of(failed);
    lost_replicas_.insert(replica);
    lost_at_[replica] = now_seconds();
  }

  void kill_lost_replicas_late() {
    for (int replica : lost_replicas_) {
      if (now_seconds() - lost_at_[replica] < cfg_.grace_seconds) continue;
      for (const Rank& r : attempt_.ranks) {
        if (r.running && replica_of(r) == replica) ::kill(-r.pid, SIGKILL);
      }
    }
  }

  void replace_lost_replicas() {
    if (cfg_.fault_tolerant == 0 || attempt_.failed_rank || received_signal_ != 0) return;
    kill_lost_replicas_late();
    const int replicas = cfg_.nproc_per_node / cfg_.fault_tolerant;
    for (auto it = lost_replicas_.begin(); it != lost_replicas_.end();) {
      const int replica = *it;
      // A moment for failures that come together (a host's ranks, one of each replica) to be
      // seen before a replica is started again on the belief that another one holds the state.
      if (!replica_exited(replica) || now_seconds() - lost_at_[replica] < kSettleSeconds) {
        ++it;
        continue;
      }
      bool other_runs = false, other_finished = false;
      for (int other = 0; other < replicas; ++other) {
        if (other == replica || lost_replicas_.count(other)) continue;
        other_runs = other_runs || replica_running_whole(other);
        other_finished = other_finished || replica_finished(other);
      }
      const Rank& first = attempt_.ranks[replica * cfg_.fault_tolerant];
      if (!other_runs && other_finished) {  // a survivor trained to the end: nothing to rejoin
        std::fprintf(stderr, "fsdprun: replica %d lost rank %d (%s) after another replica finished; not "
                     "starting it again\n", replica, lost_rank_[replica], lost_status_[replica].c_str());
        it = lost_replicas_.erase(it);
        continue;
      }
      if (!other_runs || restarts_used_ >= cfg_.max_restarts) {
        // No survivor holds the state (or no restart is left): fail the attempt as without the flag.
        fail_attempt(first_failed_of(replica));
        return;
      }
      ++restarts_used_;
      const int incarnation = ++incarnations_[replica];
      std::fprintf(stderr, "fsdprun: replica %d (ranks %d-%d) lost rank %d (%s); starting it again (incarnation %d, "
                   "restart %d of %d) while the other replicas train\n", replica, first.global_rank,
                   first.global_rank + cfg_.fault_tolerant - 1, lost_rank_[replica],
                   lost_status_[replica].c_str(), incarnation, restarts_used_, cfg_.max_restarts);
      for (int i = replica * cfg_.fault_tolerant; i < (replica + 1) * cfg_.fault_tolerant; ++i) {
        spawn_rank(attempt_.ranks[i], program_path_, cfg_.command,
                   rank_environment(cfg_, i, port_, restart_count_, incarnation));
      }
      it = lost_replicas_.erase(it);
    }
  }

  int first_failed_of(int replica) const {
    for (const Rank& r : attempt_.ranks) {
      if (replica_of(r) == replica && r.global_rank == lost_rank_.at(replica)) return r.local_rank;
    }
    return replica * cfg_.fault_tolerant;
  }

  void fail_attempt(int local_rank) {
    attempt_.failed_rank = local_rank;
    attempt_.ranks[local_rank].wait_status = lost_wait_status_[replica_of(attempt_.ranks[local_rank])];
    attempt_.stopped_count = live_count();
    lost_replicas_.clear();
    stop_all(SIGTERM);
  }

  void announce_restart(int restart_count) const {
    const Rank& r = attempt_.ranks[*attempt_.failed_rank];
    std::fprintf(stderr, "fsdprun: rank %d failed (%s); restarting all ranks (attempt %d of %d)\n", r.global_rank,
                 short_status(r.wait_status).c_str(), restart_count + 1, cfg_.max_restarts + 1);
  }

  void start_ranks(int restart_count) {
    std::vector<Rank>& ranks = attempt_.ranks;
    ranks.resize(cfg_.nproc_per_node);
    for (int i = 0; i < cfg_.nproc_per_node; ++i) {
      ranks[i].local_rank = i;
      ranks[i].global_rank = global_rank(cfg_, i);
      ranks[i].prefix = "[rank" + std::to_string(ranks[i].global_rank) + "]: ";
      try {
        spawn_rank(ranks[i], program_path_, cfg_.command, rank_environment(cfg_, i, port_, restart_count));
      } catch (const UsageError&) {
        stop_all(SIGKILL);  // do not leave the ranks started so far behind
        while (live_count() > 0) reap_children(/*block=*/true);
        throw;
      }
    }
  }

  int live_count() const {
    const std::vector<Rank>& ranks = attempt_.ranks;
    return static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; }));
  }

  // Sleeps in poll() until output, a signal or the kill deadline; relays output.
  void wait_for_events() {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<Stream*> streams{nullptr};
    for (Rank& r : attempt_.ranks) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    }
    int timeout_ms = -1;
    if (attempt_.kill_deadline > 0) {
      // Clamped before the conversion: a long grace period must not overflow poll()'s int.
      const double left_ms = std::clamp((attempt_.kill_deadline - now_seconds()) * 1000 + 1, 0.0, 3.6e6);
      timeout_ms = static_cast<int>(left_ms);
    }
    if (!lost_replicas_.empty()) timeout_ms = timeout_ms < 0 ? 100 : std::min(timeout_ms, 100);
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump_stream(*streams[i], prefix_of(*streams[i]));
    }
  }

  const std::string& prefix_of(const Stream& s) const {
    for (const Rank& r : attempt_.ranks) {
      if (&r.out == &s || &r.err == &s) return r.prefix;
    }
    static const std::string none;
    return none;
  }

  // SIGINT/SIGTERM are forwarded to every live rank, start the shutdown and rule out restarts.
  void handle_signals() {
    unsigned char sig;
    while (::read(g_signal_pipe[0], &sig, 1) == 1) {
      if (sig == SIGCHLD) continue;  // reap_children() runs next anyway
      if (received_signal_ == 0) {
        received_signal_ = sig;
        if (!attempt_.failed_rank) attempt_.stopped_count = live_count();
      }
      stop_all(sig);
    }
  }

  void reap_children(bool block = false) {
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
      for (Rank& r : attempt_.ranks) {
        if (r.pid == pid && r.running) on_rank_exit(r, status);
      }
      if (block) return;
    }
  }

  void on_rank_exit(Rank& r, int status) {
    r.running = false;
    r.wait_status = status;
    // The rank is gone, so all it wrote is already in the pipes: drain them
    // now rather than waiting for EOF, which a leftover child could delay.
    pump_stream(r.out, r.prefix);
    pump_stream(r.err, r.prefix);
    close_stream(r.out, r.prefix);
    close_stream(r.err, r.prefix);
    if (cfg_.fault_tolerant > 0 && !succeeded(status) && !attempt_.failed_rank && received_signal_ == 0) {
      const int replica = replica_of(r);
      if (!lost_replicas_.count(replica)) {  // the first rank of it that failed is the cause
        lost_rank_[replica] = r.global_rank;
        lost_status_[replica] = short_status(status);
        lost_wait_status_[replica] = status;
        lose_replica(r);
      }
      return;
    }
    if (!succeeded(status) && !attempt_.failed_rank && received_signal_ == 0) {
      attempt_.failed_rank = r.local_rank;
      attempt_.stopped_count = live_count();
      stop_all(SIGTERM);
    }
  }

  // Sends `sig` to the process group of every live rank; the first call also
  // arms the SIGKILL deadline.
  void stop_all(int sig) {
    for (const Rank& r : attempt_.ranks) {
      if (!r.running) continue;
      ::kill(-r.pid, sig);
      if (sig != SIGKILL) ::kill(-r.pid, SIGCONT);  // a stopped rank acts on it only once resumed
    }
    if (attempt_.kill_deadline == 0 && sig != SIGKILL) attempt_.kill_deadline = now_seconds() + cfg_.grace_seconds;
  }

  void enforce_kill_deadline() {
    if (attempt_.kill_deadline > 0 && !attempt_.killed && now_seconds() >= attempt_.kill_deadline) {
      attempt_.killed = true;
      stop_all(SIGKILL);
    }
  }

  // Prints the reason for a non-zero exit of the last attempt and returns fsdprun's exit status.
  // Whichever came first, a failing rank or a signal to fsdprun, is the reason.
  int report() const {
    if (attempt_.failed_rank) {
      const Rank& r = attempt_.ranks[*attempt_.failed_rank];
      std::string others = attempt_.stopped_count > 0 ? "stopped the other " + plural_ranks(attempt_.stopped_count)
                                                      : "no other ranks were running";
      std::fprintf(stderr, "fsdprun: rank %d %s; %s\n", r.global_rank, describe_status(r.wait_status).c_str(),
                   others.c_str());
      if (WIFEXITED(r.wait_status)) return WEXITSTATUS(r.wait_status);  // 1..255 here
      return 1;
    }
    if (received_signal_ == 0) return 0;
    std::fprintf(stderr, "fsdprun: received %s; stopped %s\n", signal_name(received_signal_).c_str(),
                 plural_ranks(attempt_.stopped_count).c_str());
    return 128 + received_signal_;
  }

  const LaunchConfig& cfg_;
  std::string program_path_;
  int port_;  // the same for every attempt: rank 0 of the next one binds it again
  Attempt attempt_;
  int restart_count_ = 0;  // the attempt's (TORCHELASTIC_RESTART_COUNT)
  int restarts_used_ = 0;  // of --max-restarts: attempts and replaced replicas
  std::set<int> lost_replicas_;  // --fault-tolerant: replicas waiting to be started again
  std::map<int, int> incarnations_, lost_rank_, lost_wait_status_;
  std::map<int, std::string> lost_status_;
  std::map<int, double> lost_at_;
  static constexpr double kSettleSeconds = 1.0;
  int received_signal_ = 0;  // first SIGINT/SIGTERM received; no restart after it
};

}  // namespace

std::optional<std::string> resolve_program(const std::string& program) {
  if (program.empty()) return std::nullopt;
  if (program.find('/') != std::string::npos) {
    return is_executable_file(program) ? std::optional<std::string>(program) : std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/bin:/usr/bin";
  size_t start = 0;
  while (true) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;  // empty entry = cwd
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) return std::nullopt;
    start = end + 1;
  }
}

namespace {

// Whether `port` is free for a listening socket on every address (as c10d's TCPStore server
// binds it: the IPv6 wildcard, dual-stack), checked by binding it.
bool port_is_free(int port) {
  for (int family : {AF_INET6, AF_INET}) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage addr{};
    socklen_t len;
    if (family == AF_INET6) {
      int off = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    }
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
    ::close(fd);
    return bound;
  }
  return false;
}

}  // namespace

int pick_master_port(const std::string& addr) {
  // The kernel's bind(0) port comes from the ephemeral range, where every outgoing connection
  // (Gloo's, the store clients', a parallel test's) also takes its local port: one of them could
  // take it before rank 0 binds it. A random free port below that range can only collide with
  // another launcher's random pick in the same second (1 in ~20000).
  int low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int lo = 0, hi = 0;
    if (std::fscanf(f, "%d %d", &lo, &hi) == 2 && lo > 0) low = lo;
    std::fclose(f);
  }
  const int first = 10000;
  if (low - first >= 1000) {
    std::random_device seed;
    std::mt19937 rng(seed());
    std::uniform_int_distribution<int> pick(first, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(rng);
      if (port_is_free(port)) return port;
    }
  }
  return find_free_port(addr);
}

int find_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  int rc = ::getaddrinfo(addr.c_str(), "0", &hints, &results);
  if (rc != 0) throw UsageError{"cannot resolve master address '" + addr + "': " + ::gai_strerror(rc)};

  int port = -1;
  for (addrinfo* ai = results; ai != nullptr && port < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
    ::close(fd);
  }
  ::freeaddrinfo(results);
  if (port < 0) {
    throw UsageError{"cannot bind a free port on master address '" + addr + "'; pass --master-port"};
  }
  return port;
}

namespace {

int master_port(const LaunchConfig& config) {
  if (config.master_port != 0) return config.master_port;
  // On all nodes but the master, master_addr is another host's: nothing to check by binding it.
  if (config.nnodes > 1) return kStaticMasterPort;
  find_free_port(config.master_addr);  // the master address resolves and binds, or a clear error
  return pick_master_port(config.master_addr);
}

}  // namespace

namespace {

// --fault-tolerant: fsdp_store_keeper, next to this fsdprun, serves the store on `port` until
// fsdprun exits (the kernel kills it then, as it does a rank).
std::string store_keeper_path() {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
  dir = dir.substr(0, dir.rfind('/') + 1);
  const std::string path = dir + "fsdp_store_keeper";
  if (!is_executable_file(path)) {
    throw UsageError{"--fault-tolerant needs fsdp_store_keeper next to fsdprun (" + path +
                     " is missing): build or install it with fsdprun"};
  }
  return path;
}

pid_t start_store_keeper(int port) {
  const std::string path = store_keeper_path();
  const std::string port_text = std::to_string(port);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);
    ::execl(path.c_str(), path.c_str(), port_text.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid < 0) throw UsageError{std::string("fork: ") + std::strerror(errno)};
  return pid;
}

void stop_store_keeper(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace

int launch(const LaunchConfig& config) {
  if (config.nproc_per_node < 1) throw UsageError{"--nproc-per-node must be >= 1"};
  if (config.nnodes < 1 || config.node_rank < 0 || config.node_rank >= config.nnodes) {
    throw UsageError{"--nnodes must be >= 1 and --node-rank in [0, --nnodes - 1]"};
  }
  if (config.max_restarts < 0 || (config.max_restarts > 0 && config.nnodes > 1)) {
    throw UsageError{"--max-restarts must be >= 0, and 0 with --nnodes > 1"};
  }
  if (!(config.grace_seconds >= 0 && config.grace_seconds <= 86400)) {  // NaN fails too
    throw UsageError{"--grace-seconds must be a number of seconds in [0, 86400]"};
  }
  if (config.command.empty()) throw UsageError{"missing PROGRAM to launch"};
  std::optional<std::string> path = resolve_program(config.command.front());
  if (!path) {
    throw UsageError{"PROGRAM '" + config.command.front() + "' not found or not executable" +
                     (config.command.front().find('/') == std::string::npos ? " (searched PATH)" : "")};
  }
  if (config.fault_tolerant > 0) {
    const int f = config.fault_tolerant;
    if (config.nnodes > 1) throw UsageError{"--fault-tolerant runs on one node (--nnodes 1)"};
    if (config.nproc_per_node % f != 0 || config.nproc_per_node / f < 2) {
      throw UsageError{"--fault-tolerant " + std::to_string(f) + " needs at least 2 replicas of " +
                       std::to_string(f) + " ranks: --nproc-per-node must be a multiple of " +
                       std::to_string(f) + " and at least " + std::to_string(2 * f) + " (got " +
                       std::to_string(config.nproc_per_node) + ")"};
    }
  }
  const int port = master_port(config);
  Supervisor supervisor(config, *path, port);
  if (config.fault_tolerant == 0) return supervisor.run();
  const pid_t keeper = start_store_keeper(port);
  const int status = supervisor.run();
  stop_store_keeper(keeper);
  return status;
}

}  // namespace fsdprun
