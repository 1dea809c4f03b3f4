"""End to end, one host: a rank killed mid-run is restarted by its launcher and the job ends as if
nothing had happened. gpt_train (2 ranks, FULL_SHARD, a checkpoint every 4 steps, `--resume auto`) runs under
  - fsdprun --max-restarts 1, and
  - torchrun's elastic agent (--standalone --max-restarts 1 --no-python): the ranks join the
    agent's store (TORCHELASTIC_USE_AGENT_STORE), which outlives the killed attempt;
rank 1 is SIGKILLed once a checkpoint is published. Asserted: the launcher exits 0, rank 0 says
it resumed from a checkpoint, and the final parameters (--save-full) are bitwise those of an
uninterrupted run.

restart_e2e.py BIN_DIR CORPUS. RESTART_TEST_BREAK=bitwise|resumed perturbs one expectation so
its assertion must fail.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BREAK = os.environ.get("RESTART_TEST_BREAK", "")
STEPS = 40
TRAIN = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "32", "--batch", "2",
         "--lr", "3e-3", "--seed", "7", "--steps", str(STEPS), "--save-every", "4"]


def rank_pid(launcher_pid, rank):
    """The pid of the process below launcher_pid whose environment has RANK=rank."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"RANK={rank}".encode() not in environ.read_bytes().split(b"\0"):
                continue
            if launcher_pid in ancestors(int(environ.parent.name)):
                return int(environ.parent.name)
        except OSError:
            continue
    return None


def ancestors(pid):
    found = []
    while pid > 1:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        pid = int(fields[1])
        found.append(pid)
    return found


def train(launcher, bin_dir, corpus, folder, kill_rank=None):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "30"})
    command = [*launcher, f"{bin_dir}/gpt_train", "--data", corpus, *TRAIN, "--checkpoint-dir",
               f"{folder}/ckpt", "--resume", "auto", "--save-full", f"{folder}/final.params"]
    out = open(f"{folder}/out.log", "w+")
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        if kill_rank is not None:
            deadline = time.monotonic() + 120
            victim = None
            while victim is None:
                assert time.monotonic() < deadline and proc.poll() is None, \
                    "no checkpoint before the end:\n" + Path(out.name).read_text()[-3000:]
                if (Path(folder) / "ckpt" / "latest").exists():
                    victim = rank_pid(proc.pid, kill_rank)
                time.sleep(0.02)
            os.kill(victim, signal.SIGKILL)
            latest = (Path(folder) / "ckpt" / "latest").read_text().strip()
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = Path(out.name).read_text()
    assert code == 0, f"{launcher[0]} exited {code}:\n" + text[-4000:]
    if kill_rank is not None:
        print(f"  rank {kill_rank} killed with {latest} published;",
              next((l.strip() for l in text.splitlines() if "resumed from" in l), "no resume line"))
    return text, Path(f"{folder}/final.params").read_bytes()


def main(bin_dir, corpus):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        launchers = {
            "fsdprun --max-restarts 1": [f"{bin_dir}/fsdprun", "--nproc-per-node", "2", "--max-restarts", "1"],
            "torchrun --standalone --max-restarts 1": [torchrun, "--standalone", "--nproc-per-node", "2",
                                                       "--max-restarts", "1", "--monitor-interval", "0.1",
                                                       "--log-dir", f"{tmp}/torchrun", "--no-python"],
        }
        os.makedirs(f"{tmp}/plain")
        _, uninterrupted = train(launchers["fsdprun --max-restarts 1"], bin_dir, corpus, f"{tmp}/plain")
        for name, launcher in launchers.items():
            folder = tempfile.mkdtemp(dir=tmp)
            print(name)
            text, params = train(launcher, bin_dir, corpus, folder, kill_rank=1)
            resumed = "resumed from" in text and BREAK != "resumed"
            assert resumed, f"{name}: rank 0 never resumed from a checkpoint:\n" + text[-4000:]
            same = params == uninterrupted
            assert same != (BREAK == "bitwise"), \
                f"{name}: final parameters differ from the uninterrupted run's"
            print(f"  final parameters bitwise equal to the uninterrupted run's ({len(params)} bytes)")
    print("restart test: OK")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
