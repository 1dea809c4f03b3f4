"""Shared-memory collectives after a SIGKILL, one host, 2 ranks: rank 1 is SIGKILLed between two
all-gathers (Fault.SharedMemoryRankKilledMidCollective, ranks started here without a launcher so
that nothing kills rank 0 first); rank 0 must name it at once. Then, right away, a fresh job runs
the shared-memory tests under fsdprun and passes. Neither job may leave a segment in /dev/shm.

shm_kill_e2e.py BIN_DIR
"""
import os
import socket
import subprocess
import sys
from pathlib import Path

PREFIX = "fsdp-coll-"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def segments_of(pid):
    return [p.name for p in Path("/dev/shm").glob(f"{PREFIX}{pid}-*")]


def killed_run(bin_dir):
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS="60")
        ranks.append(subprocess.Popen(
            [f"{bin_dir}/fsdp_dist_tests", "--gtest_filter=Fault.SharedMemoryRankKilledMidCollective"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [r.communicate(timeout=120)[0] for r in ranks]
    print(outputs[0])
    assert ranks[1].returncode == -9, f"rank 1 should die of SIGKILL, got {ranks[1].returncode}"
    assert ranks[0].returncode == 0, f"rank 0 failed (exit {ranks[0].returncode})"
    assert "it exited" in outputs[0], "rank 0 did not name the killed rank"
    assert not segments_of(ranks[0].pid), f"segments left behind: {segments_of(ranks[0].pid)}"


def next_run(bin_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS="60")
    run = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/fsdp_dist_tests",
                          "--gtest_filter=ShmCollectives.*"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300)
    print(run.stdout[-3000:])
    assert run.returncode == 0, f"the run after the killed one failed (exit {run.returncode})"


def main():
    bin_dir = sys.argv[1]
    killed_run(bin_dir)
    next_run(bin_dir)
    print("shm_kill_e2e: OK")


if __name__ == "__main__":
    main()
