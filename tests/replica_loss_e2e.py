"""Replicas that survive a lost peer: gpt_train --strategy hybrid --fault-tolerant under fsdprun
--fault-tolerant 2 --max-restarts M, W = 4 as 2 replicas x 2 shards, 20 steps.

    replica_loss_e2e.py BIN_DIR kill|transfer|both

kill:     rank 3 (replica 1) SIGKILLs itself as step 5 begins. Replica 0 never stops: its metrics
          hold every step 0..19 once, each step's replicas_alive (2, then 1 from step 5 until the
          replacement joins, then 2); the replacement of replica 1 receives the state from replica
          0 (no checkpoint read) and from then on every rank's parameters and AdamW state hash
          equal to its peer's in the other replica; the losses of replica 0 alone equal those of a
          1-replica run (W = 2, FULL_SHARD) resumed from the checkpoint of step 5 on the same rows.
transfer: as kill, and the replacement of rank 3 dies receiving the state: a second replacement
          joins; the same equalities at the end.
Each step of the job sleeps 700 ms after its work (--test-pause-per-step): the replacement's start
(a few seconds here) then falls within the 20 steps. A step's step_ms excludes the sleep.
both:     ranks 1 and 3 (one of each replica) die at step 5: no replica holds the state, so the
          launcher restarts every rank, which resumes from the checkpoint of step 5 and finishes.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS, KILL_STEP, SAVE_EVERY, PAUSE_S = 20, 5, 5, 0.7
MODEL = ["--layers", "2", "--dim", "64", "--heads", "4", "--seq", "32", "--batch", "4"]


def data_dir():
    return os.path.dirname(os.__file__)  # any folder of text: the standard library's sources


def records(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_of(path):
    return [r for r in records(path) if "step" in r]


def extra(path, key):
    return [r for r in records(path) if key in r]


def run_job(bin_dir, tmp, scenario):
    flags = ["--strategy", "hybrid", "--shard-group-size", "2", "--fault-tolerant",
             "--replica-vote-timeout", "10", "--test-pause-per-step", str(int(PAUSE_S * 1000)), "--steps", str(STEPS), *MODEL,
             "--data", data_dir(),
             "--metrics", str(tmp / "m-{rank}.jsonl"), "--log-every", "1000",
             "--checkpoint-dir", str(tmp / "ckpt"), "--save-every", str(SAVE_EVERY), "--resume", "auto",
             "--test-kill-step", str(KILL_STEP)]
    flags += {"kill": ["--test-kill-rank", "3"],
              "transfer": ["--test-kill-rank", "3", "--test-kill-in-transfer", "3"],
              "both": ["--test-kill-rank", "1", "--test-kill-rank", "3"]}[scenario]
    env = dict(os.environ, OMP_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS="60")
    cmd = [f"{bin_dir}/fsdprun", "--nproc-per-node", "4", "--fault-tolerant", "2", "--max-restarts", "3",
           "--grace-seconds", "3",
           f"{bin_dir}/gpt_train", *flags]
    start = time.monotonic()
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    copied = False
    # The checkpoint of step 5 (replica 0's state when it goes on alone) for the 1-replica run:
    # copied before the run's later saves replace it.
    while job.poll() is None:
        step5 = tmp / "ckpt" / f"step-{KILL_STEP:08d}"
        if not copied and len(steps_of(tmp / "m-0.jsonl")) > KILL_STEP + 1 and step5.exists():
            shutil.copytree(step5, tmp / "ckpt5" / step5.name)
            (tmp / "ckpt5" / "latest").write_text(step5.name + "\n")
            copied = True
        assert time.monotonic() - start < 240, "the job ran for 240 s"
        time.sleep(0.05)
    output = job.communicate()[0]
    print(output[-6000:])
    assert job.returncode == 0, f"fsdprun exited {job.returncode}"
    return output, time.monotonic() - start


def run_one_replica(bin_dir, tmp, last_step):
    """W = 2, FULL_SHARD, resumed from step 5: the rows of replica 0 (global ranks 0 and 1)."""
    flags = ["--steps", str(last_step), *MODEL, "--data", data_dir(), "--metrics", str(tmp / "one-{rank}.jsonl"),
             "--log-every", "1000", "--checkpoint-dir", str(tmp / "ckpt5"), "--resume"]
    env = dict(os.environ, OMP_NUM_THREADS="1", FSDP_TIMEOUT_SECONDS="60")
    subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train", *flags], env=env,
                   check=True, timeout=180, stdout=subprocess.DEVNULL)
    return {r["step"]: r["loss"] for r in steps_of(tmp / "one-0.jsonl")}


def check_every_step_once(path, first=0):
    steps = [r["step"] for r in steps_of(path)]
    assert steps == list(range(first, STEPS)), f"{path.name}: steps {steps}"


def check_bitwise_equal_replicas(tmp):
    for shard in (0, 1):
        mine, peer = extra(tmp / f"m-{shard}.jsonl", "params_hash"), extra(tmp / f"m-{shard + 2}.jsonl", "params_hash")
        assert mine and peer, f"rank {shard} or {shard + 2} wrote no final hashes"
        for key in ("params_hash", "optimizer_hash"):
            assert mine[-1][key] == peer[-1][key], \
                f"{key} differs between rank {shard} and rank {shard + 2}: {mine[-1][key]} vs {peer[-1][key]}"
    print("final parameters and AdamW state: bitwise equal across the replicas (ranks 0=2, 1=3)")


def check_survivor(bin_dir, tmp, output, elapsed, scenario):
    check_every_step_once(tmp / "m-0.jsonl")
    check_every_step_once(tmp / "m-1.jsonl")
    survivor = steps_of(tmp / "m-0.jsonl")
    alive = [r["replicas_alive"] for r in survivor]
    assert "starting it again" in output, "fsdprun did not restart replica 1 alone"
    joined = extra(tmp / "m-2.jsonl", "joined_at_step")
    assert joined, "the replacement of replica 1 never joined"
    join_step = joined[-1]["joined_at_step"]
    assert KILL_STEP < join_step <= STEPS, f"joined at step {join_step}"
    expected = [2] * KILL_STEP + [1] * (join_step - KILL_STEP) + [2] * (STEPS - join_step)
    assert alive == expected, f"replicas_alive per step {alive}, expected {expected}"
    shares = [r["batch_share"] for r in survivor]
    assert shares == [1 / a for a in alive], f"batch_share {shares}"
    check_every_step_once(tmp / "m-2.jsonl", join_step)
    check_every_step_once(tmp / "m-3.jsonl", join_step)
    if scenario == "transfer":
        assert "incarnation 2" in output, "the replacement that died receiving was not replaced"
        assert joined[-1]["incarnation"] == 2, f"joined: {joined}"
    check_bitwise_equal_replicas(tmp)
    step_ms = {r["step"]: round(r["step_ms"]) for r in survivor}
    print(f"replica 0's step times (ms): {step_ms}")
    transfers = [(r["after_step"], r["replicas_joined"], round(r["transfer_ms"])) for r in extra(tmp / "m-0.jsonl", "transfer_ms")]
    print(f"rank 0's transfers to a replacement (after step, replicas joined, ms): {transfers}")
    alone_s = sum(r["step_ms"] / 1000 + PAUSE_S for r in survivor if r["replicas_alive"] == 1)
    print(f"replica 1 lost at step {KILL_STEP}, its replacement joined at step {join_step} "
          f"({join_step - KILL_STEP} steps missed, {alone_s:.1f} s of replica 0 training alone); "
          f"the job took {elapsed:.1f} s")
    one = run_one_replica(bin_dir, tmp, join_step)
    alone = {r["step"]: r["loss"] for r in survivor if KILL_STEP <= r["step"] < join_step}
    for step, loss in alone.items():
        assert one.get(step) == loss, f"step {step}: survivor loss {loss!r}, 1-replica run {one.get(step)!r}"
    print(f"survivor's losses alone (steps {min(alone)}..{max(alone)}) equal the 1-replica run's: {alone}")


def check_full_restart(tmp, output):
    assert "restarting all ranks" in output, "both replicas lost a rank, but fsdprun did not restart every rank"
    assert "resumed from" in output, "the restarted job did not resume from the checkpoint"
    for rank in range(4):
        steps = [r["step"] for r in steps_of(tmp / f"m-{rank}.jsonl")]
        assert steps == list(range(KILL_STEP, STEPS)), f"rank {rank} after the restart: steps {steps}"
    check_bitwise_equal_replicas(tmp)


def main():
    bin_dir, scenario = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix=f"replica_{scenario}_") as tmp:
        tmp = Path(tmp)
        output, elapsed = run_job(bin_dir, tmp, scenario)
        if scenario == "both":
            check_full_restart(tmp, output)
        else:
            check_survivor(bin_dir, tmp, output, elapsed, scenario)
    print(f"replica_loss_e2e {scenario}: OK")


if __name__ == "__main__":
    main()
