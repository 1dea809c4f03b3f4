"""A pipelined gpt_train run that loses a rank mid-schedule: W = 4 ranks started here without a
launcher (so that nothing stops the others for them), `--pp 2` (the mesh pp 2 x dp 2, 1F1B, each
stage sharded over dp); once rank 1 has logged two steps, it is SIGKILLed. Every other rank must
exit, non-zero, within half of FSDP_TIMEOUT_SECONDS (the loss found, not waited out), with the
library's peer error; and the survivors' errors name rank 1 as the rank they waited for. A rank
that fails by the cascade (its peer exited in error first) names that peer: not every survivor
names rank 1.

    pp_kill_e2e.py BIN_DIR"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD, KILLED, TIMEOUT_S = 4, 1, 20
PEER_ERROR = "A peer rank has probably died"
# A shared-memory wait names the rank by its world rank; Gloo's names the ranks it may be.
NAMES_KILLED = rf"waiting for rank {KILLED} on|one of rank\(s\) (\d+, )*{KILLED}\b"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bin_dir, tmp, port):
    data = os.path.dirname(os.__file__)  # any folder of text: the standard library's sources
    flags = ["--pp", "2", "--pp-schedule", "1f1b", "--microbatches", "2", "--model", "llama", "--kv-heads", "2",
             "--ffn-dim", "64", "--layers", "2", "--dim", "32", "--heads", "4", "--seq", "16", "--batch", "2",
             "--steps", "100000", "--data", data, "--metrics", str(tmp / "m-{rank}.jsonl"), "--log-every", "1000"]
    ranks = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS=str(TIMEOUT_S))
        ranks.append(subprocess.Popen([f"{bin_dir}/gpt_train", *flags], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return ranks


def steps_logged(path):
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip() and "step" in json.loads(line))


def main():
    bin_dir = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="pp_kill_") as tmp:
        tmp = Path(tmp)
        ranks = start(bin_dir, tmp, free_port())
        try:
            deadline = time.monotonic() + 120
            while steps_logged(tmp / f"m-{KILLED}.jsonl") < 2:
                assert time.monotonic() < deadline, "rank 1 logged no steps in 120 s"
                assert all(r.poll() is None for r in ranks), "a rank exited before the kill"
                time.sleep(0.05)
            ranks[KILLED].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            outputs, exited_after = {}, {}
            for rank, r in enumerate(ranks):
                outputs[rank] = r.communicate(timeout=TIMEOUT_S + 40)[0]
                exited_after[rank] = time.monotonic() - killed_at
                print(f"rank {rank}: exit {r.returncode} after {exited_after[rank]:.1f} s")
        finally:
            for r in ranks:
                if r.poll() is None:
                    r.kill()
        assert ranks[KILLED].returncode == -signal.SIGKILL, f"rank 1 should die of SIGKILL: {ranks[KILLED].returncode}"
        named = []
        for rank, r in enumerate(ranks):
            if rank == KILLED:
                continue
            assert r.returncode not in (0, None), f"rank {rank} exited {r.returncode} after losing rank 1"
            assert exited_after[rank] < TIMEOUT_S / 2, \
                f"rank {rank} took {exited_after[rank]:.1f} s: it waited for the timeout rather than finding the loss"
            assert PEER_ERROR in outputs[rank], f"rank {rank} has no peer error:\n{outputs[rank][-2000:]}"
            if re.search(NAMES_KILLED, outputs[rank]):
                named.append(rank)
        assert named, f"no rank names rank 1: {outputs}"
        print(f"ranks naming rank 1: {named}")
    print("pp_kill_e2e: OK")


if __name__ == "__main__":
    main()
