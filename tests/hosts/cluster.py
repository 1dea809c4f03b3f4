"""Launching ranks of a program across Hosts (tests/hosts/netns.py) the way torchrun does on each
node: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (host 0's address),
MASTER_PORT, and GLOO_SOCKET_IFNAME=eth0 so Gloo binds the host's link (ranks of one host then
talk over the kernel's loopback path: local traffic never touches eth0)."""
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


class Launch:
    """world = len(hosts) * per_host ranks; rank r runs on host r // per_host."""

    def __init__(self, hosts, program, args, per_host=2, env=None, metrics_dir=None, port=None):
        self.hosts = hosts
        self.per_host = per_host
        self.world = hosts.n * per_host
        if port is None:
            port = _next_port[0]
            _next_port[0] += 1
        self.port = port
        self.metrics_dir = metrics_dir or tempfile.mkdtemp(prefix="fsdp-hosts-")
        self.metrics = f"{self.metrics_dir}/m-{{rank}}.jsonl"
        self.procs = []
        self.logs = []
        self.started = time.monotonic()
        for rank in range(self.world):
            host = rank // per_host
            e = dict(os.environ)
            e.update({"RANK": str(rank), "WORLD_SIZE": str(self.world),
                      "LOCAL_RANK": str(rank % per_host), "LOCAL_WORLD_SIZE": str(per_host),
                      "MASTER_ADDR": hosts.addresses[0], "MASTER_PORT": str(port),
                      "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
            e.update(env or {})
            log = open(f"{self.metrics_dir}/out-{rank}.log", "w+")
            self.logs.append(log)
            self.procs.append(hosts.popen(host, [program, *args, "--metrics", self.metrics], env=e,
                                          stdout=log, stderr=subprocess.STDOUT))

    def rank_metrics(self, rank):
        return read_metrics(self.metrics.replace("{rank}", str(rank)))

    def output(self, rank):
        self.logs[rank].flush()
        return Path(self.logs[rank].name).read_text()

    def wait(self, timeout):
        """Exit codes of every rank; kills the rest and raises if the run outlives timeout."""
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

    def tails(self, n=6):
        out = []
        for r in range(self.world):
            lines = self.output(r).splitlines()
            out.append(f"--- rank {r} (exit {self.procs[r].poll()}):\n" + "\n".join(lines[-n:]))
        return "\n".join(out)

    def check(self, timeout):
        codes = self.wait(timeout)
        assert codes == [0] * self.world, f"exit codes {codes}:\n" + self.tails()
