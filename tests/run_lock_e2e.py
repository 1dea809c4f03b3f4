"""Two runs into one --checkpoint-dir at the same moment never lose a loadable checkpoint.

    run_lock_e2e.py BIN_DIR CORPUS_DIR [TRIALS]

Each trial starts two 2-rank jobs (fsdprun + gpt_train --resume auto --save-every 2) into one
fresh folder within a few milliseconds of each other. Asserted per trial: at least one job
trains to the end; a job that does not was refused by the run lock with a message naming the
run that holds the folder (host, pid) and the lock file, within seconds; and the checkpoint that
`latest` names then loads (a third run resumes from it, every tensor's CRC-32 checked) at the
step the finished job saved. Without the lock, both jobs write the same step folders: when the
race was found, 2 of 5 trials left a `latest` whose checkpoint no longer loaded."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.argv[1])
CORPUS = Path(sys.argv[2])
TRIALS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
GPT, FSDPRUN = str(BIN / "gpt_train"), str(BIN / "fsdprun")
TINY = ["--layers", "1", "--dim", "16", "--heads", "2", "--seq", "16", "--batch", "2",
        "--data", str(CORPUS), "--max-data-mb", "1"]
STEPS = 6
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FSDP_TIMEOUT_SECONDS": "30"}
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(name, None)


def start(folder, steps, nproc=2, resume="auto"):
    cmd = [FSDPRUN, "--nproc-per-node", str(nproc), GPT, *TINY, "--steps", str(steps),
           "--save-every", "2", "--checkpoint-dir", str(folder), "--resume", resume]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=ENV, start_new_session=True)


def finish(proc, timeout=120):
    start_time = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out = proc.communicate()[0] + "\nHANG"
        return "hang", out, time.monotonic() - start_time
    return proc.returncode, out, time.monotonic() - start_time


def trial(tmp, k):
    folder = tmp / f"ck{k}"
    jobs = [start(folder, STEPS), start(folder, STEPS)]  # the same moment
    began = time.monotonic()
    results = [finish(job) for job in jobs]
    seconds = [round(time.monotonic() - began, 1)]
    problems = []
    finished = [r for r in results if r[0] == 0]
    refused = [r for r in results if r[0] != 0]
    if not finished:
        problems.append("no job finished")
    for rc, out, _ in refused:
        if rc == "hang" or "is in use by another run" not in out or "run.lock" not in out \
                or "pid " not in out:
            problems.append(f"a job failed without the run lock's message (rc {rc}):\n{out[-2000:]}")
    latest = (folder / "latest").read_text().strip() if (folder / "latest").exists() else None
    if latest != f"step-{STEPS:08d}":
        problems.append(f"latest is {latest!r}, not step-{STEPS:08d}")
    # The published checkpoint loads: a W = 1 run resumes from it (CRC-32 of every tensor).
    check = finish(start(folder, STEPS + 2, nproc=1, resume="always"))
    if check[0] != 0 or f"resumed from {folder}/{latest} at step {STEPS}" not in check[1]:
        problems.append(f"the checkpoint latest names does not load (rc {check[0]}):\n{check[1][-2000:]}")
    outcome = "both finished (one after the other)" if len(finished) == 2 else "one refused"
    return outcome, seconds[0], problems


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="run_lock_") as tmp:
        for k in range(TRIALS):
            outcome, seconds, problems = trial(Path(tmp), k)
            print(f"trial {k + 1:2d}: {outcome}, {seconds} s; "
                  f"{'ok' if not problems else 'FAILED: ' + problems[0].splitlines()[0]}", flush=True)
            failures += [f"trial {k + 1}: {p}" for p in problems]
    if failures:
        print("\n\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"run lock: {TRIALS} trials, every published checkpoint loadable: OK")


if __name__ == "__main__":
    main()
