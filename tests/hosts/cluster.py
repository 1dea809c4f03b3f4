"""Launching ranks of a program across Hosts (tests/hosts/netns.py).

Launch starts every rank itself with the variables a launcher would set: torchrun's (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR = host 0's address, MASTER_PORT), or Slurm's
(srun: SLURM_PROCID, ..., the node list of the hosts' names) or Open MPI's (mpirun:
OMPI_COMM_WORLD_*, with MASTER_ADDR/PORT as `mpirun -x` passes them) alone. HostLaunch starts one
launcher per host (fsdprun or torchrun with its multi-node flags), which starts that host's ranks.
GLOO_SOCKET_IFNAME=eth0 makes Gloo bind the host's link (ranks of one host then talk over the
kernel's loopback path: local traffic never touches eth0)."""
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# A fresh namespace has no sockets at all, so any fixed port is free in it; each launch takes
# the next one so that a TIME_WAIT of the previous run's store cannot get in the way.
_next_port = [29400]


def make_corpus(path, size=40_000, seed=7):
    """A small deterministic text (words of a fixed list): the tests' own data."""
    words = ("the a of to and in is it that host rank shard gather reduce scatter ring link "
             "byte step loss model layer train data wire packet node group peer time").split()
    rng = random.Random(seed)
    out, n = [], 0
    while n < size:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + ".\n"
        out.append(line)
        n += len(line)
    Path(path).write_text("".join(out))
    return str(path)


def snapshot_program(program, folder, attempts=30):
    """Copies a (statically fsdp-linked) program into folder and returns folder: a rebuild of the
    tree during the test (others build in it) then cannot swap the binary between runs."""
    target = Path(folder) / Path(program).name
    for attempt in range(attempts):
        try:
            shutil.copy2(program, target)
            target.chmod(0o755)
            return str(folder)
        except OSError:
            if attempt + 1 == attempts:
                raise
            time.sleep(2)  # being relinked right now


def read_metrics(path):
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")


def next_port():
    port = _next_port[0]
    _next_port[0] += 1
    return port


def rank_variables(style, hosts, host, local_rank, per_host, port):
    """What a launcher of `style` sets for one rank; rank = host * per_host + local_rank."""
    rank, world = host * per_host + local_rank, hosts.n * per_host
    if style == "torchrun":
        return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(per_host), "MASTER_ADDR": hosts.addresses[0],
                "MASTER_PORT": str(port)}
    if style == "slurm":  # no MASTER_*: fsdp takes the first node of the list, and the job's port
        prefix = os.path.commonprefix(hosts.names)
        suffixes = [name[len(prefix):] for name in hosts.names]
        return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
                "SLURM_LOCALID": str(local_rank), "SLURM_NODEID": str(host),
                "SLURM_TASKS_PER_NODE": f"{per_host}(x{hosts.n})",
                "SLURM_JOB_NODELIST": f"{prefix}[{','.join(suffixes)}]",
                "SLURM_JOB_ID": str(port - 10000)}  # fsdp's port: 10000 + id % 20000
    assert style == "openmpi", style
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_host),
            "MASTER_ADDR": hosts.addresses[0], "MASTER_PORT": str(port)}


def base_env(env):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    e.update({"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
    e.update(env or {})
    return e


class _Processes:
    """Processes started together (one per rank, or one launcher per host), each with a log."""

    label = "rank"  # what one process is, in tails()

    def output(self, i):
        self.logs[i].flush()
        return Path(self.logs[i].name).read_text()

    def wait(self, timeout):
        """Exit codes of every process; kills the rest and raises if the run outlives timeout."""
        deadline = self.started + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"the run did not finish within {timeout} s:\n" + self.tails())
        return codes

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def check(self, timeout):
        codes = self.wait(timeout)
        assert codes == [0] * len(self.procs), f"exit codes {codes}:\n" + self.tails()

    def tails(self, n=8):
        return "\n".join(f"--- {self.label} {i} (exit {p.poll()}):\n" +
                         "\n".join(self.output(i).splitlines()[-n:]) for i, p in enumerate(self.procs))


class Launch(_Processes):
    """world = len(hosts) * per_host ranks; rank r runs on host r // per_host, or on
    placement[r] (ranks are then numbered by host order of appearance; used to make shard groups
    that span hosts). style: whose variables the ranks get (module docstring)."""

    def __init__(self, hosts, program, args, per_host=2, env=None, metrics_dir=None, port=None,
                 style="torchrun", placement=None):
        self.hosts = hosts
        self.per_host = per_host
        self.world = hosts.n * per_host
        self.port = next_port() if port is None else port
        self.metrics_dir = metrics_dir or tempfile.mkdtemp(prefix="fsdp-hosts-")
        self.metrics = f"{self.metrics_dir}/m-{{rank}}.jsonl"
        self.procs = []
        self.logs = []
        self.started = time.monotonic()
        placement = placement or [r // per_host for r in range(self.world)]
        for rank in range(self.world):
            host = placement[rank]
            local_rank = placement[:rank].count(host)
            e = base_env({})
            e.update(rank_variables(style, hosts, host, local_rank, per_host, self.port))
            if style == "torchrun":  # the placement decides the rank, not the host's block
                e["RANK"] = str(rank)
            e.update(env or {})
            log = open(f"{self.metrics_dir}/out-{rank}.log", "w+")
            self.logs.append(log)
            self.procs.append(hosts.popen(host, [program, *args, "--metrics", self.metrics], env=e,
                                          stdout=log, stderr=subprocess.STDOUT))

    def rank_metrics(self, rank):
        return read_metrics(self.metrics.replace("{rank}", str(rank)))


class HostLaunch(_Processes):
    """One launcher process per host, each starting per_host ranks: `launcher(host)` gives the
    command line before PROGRAM ARGS (fsdprun's or torchrun's multi-node flags)."""

    label = "host"

    def __init__(self, hosts, launcher, program, args, env=None):
        self.hosts = hosts
        self.dir = tempfile.mkdtemp(prefix="fsdp-hosts-")
        self.procs, self.logs = [], []
        self.started = time.monotonic()
        for host in range(hosts.n):
            log = open(f"{self.dir}/host-{host}.log", "w+")
            self.logs.append(log)
            self.procs.append(hosts.popen(host, [*launcher(host), program, *args], env=base_env(env),
                                          stdout=log, stderr=subprocess.STDOUT))


def rank_pid(hosts, host, rank, program_name):
    """The pid of `program_name` with RANK=rank inside host (started by a launcher), or None."""
    r = subprocess.run(["ip", "netns", "pids", hosts.names[host]], capture_output=True, text=True)
    for pid in r.stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and Path(cmdline[0].decode()).name == program_name \
                and f"RANK={rank}".encode() in environ:
            return int(pid)
    return None
