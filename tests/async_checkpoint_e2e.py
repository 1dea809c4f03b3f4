"""End to end: asynchronous sharded checkpoints (checkpoint_tool --async-save under fsdprun). A
save written by the background thread loads bitwise the state saved, in new processes; a kill -9
of every rank during the background write (after its shard files, before the metadata) leaves the
previous checkpoint the one that `latest` names, and it loads. A kill -9 of one rank at 10 random
moments of an async save (staging, writing, renaming, publishing) leaves the last complete
checkpoint loadable, bitwise the uninterrupted run's state at its step; a resume from an async
checkpoint equals one from a synchronous checkpoint of the same step, bitwise. gpt_train --async-save
--save-every 2 (each save completed by the next, while training went on) resumed from its step-6
checkpoint ends bitwise where the run that never stopped ends."""
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from checkpoint_e2e import children_of, kill_during_save, run

KILLS = 10
BIGGER = ["--layers", "4", "--dim", "256", "--heads", "4"]  # a save of ~40 MB: tens of ms to hit


def kill_at_random_moment(bin_dir, corpus, ckpt, delay):
    """Resume from `ckpt` (step 10), train 2 steps and save step 12 asynchronously; `delay` seconds
    after its folder appears, SIGKILL one rank (then the others). Returns the moment's phase."""
    command = [f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/checkpoint_tool", "--data", corpus,
               "--batch", "3", *BIGGER, "--load", ckpt, "--steps", "2", "--save", ckpt, "--async-save"]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = Path(ckpt) / "step-00000012"
    deadline = time.time() + 120
    ranks = []
    while len(ranks) < 2:  # found before the save: /proc's scan takes longer than a save
        assert time.time() < deadline and launcher.poll() is None, "the ranks never started"
        ranks = children_of(launcher.pid)
    while not folder.exists() and launcher.poll() is None:
        assert time.time() < deadline, "the save never started"
        time.sleep(0.0002)
    time.sleep(delay)
    random.shuffle(ranks)
    for pid in ranks:  # one rank at the chosen moment, the others once it is dead
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.kill()
    launcher.wait()
    files = sorted(p.name for p in folder.glob("*")) if folder.exists() else []
    return "published" if (Path(ckpt) / "latest").read_text().strip() == folder.name else \
        "metadata" if "metadata.json" in files else "renamed" if any(f.endswith(".safetensors") for f in files) \
        else "writing" if files else "staging"


def kills_at_random_moments(bin_dir, corpus, tmp):
    """A checkpoint of step 10, then each kill on a copy of it, `delay` uniform over an uninterrupted
    save's time (from its folder's creation to its end): the last complete checkpoint loads bitwise
    the state of the uninterrupted run at its step (10, or 12 when the kill came after the publish)."""
    base = f"{tmp}/base"
    at_10 = run(bin_dir, corpus, 2, *BIGGER, "--steps", 10, "--save", base, "--async-save")["digest"]["at_save"]
    straight = run(bin_dir, corpus, 2, *BIGGER, "--load", base, "--steps", 2, "--save", f"{tmp}/straight12",
                   "--async-save")
    expected = {"10": at_10, "12": straight["digest"]["at_save"]}
    window = 1.2 * float(straight["save_seconds"][0])
    rng = random.Random(61)
    phases = []
    for k in range(KILLS):
        trial = f"{tmp}/kill{k}"
        shutil.copytree(base, trial)
        delay = window * rng.random() ** 2  # more of them early: the staging is short
        phases.append(kill_at_random_moment(bin_dir, corpus, trial, delay))
        try:
            loaded = run(bin_dir, corpus, 2, *BIGGER, "--load", trial)
        except subprocess.CalledProcessError as e:
            raise AssertionError(f"kill {k} ({phases[-1]}): the last checkpoint does not load: {e.stderr[-600:]}")
        step = loaded["resumed_step"][0]
        assert loaded["digest"]["after_load"] == expected[step], \
            f"kill {k} ({phases[-1]}): the checkpoint of step {step} does not load the uninterrupted run's state"
        shutil.rmtree(trial)
    return phases


def gpt_train(bin_dir, corpus, *args):
    command = [f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train", "--data", corpus,
               "--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--steps", "8", *map(str, args)]
    subprocess.run(command, check=True, capture_output=True, text=True)


def gpt_train_resumes_bitwise(bin_dir, corpus, tmp):
    gpt_train(bin_dir, corpus, "--save-full", f"{tmp}/straight.pt")
    gpt_train(bin_dir, corpus, "--save-every", 2, "--checkpoint-dir", f"{tmp}/ck", "--async-save")
    (Path(tmp) / "ck" / "latest").write_text("step-00000006\n")  # resume from a middle save
    gpt_train(bin_dir, corpus, "--save-every", 2, "--checkpoint-dir", f"{tmp}/ck", "--async-save", "--resume",
              "--save-full", f"{tmp}/resumed.pt")
    straight, resumed = torch.load(f"{tmp}/straight.pt"), torch.load(f"{tmp}/resumed.pt")
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight), \
        "gpt_train --async-save resumed from step 6 does not end where the straight run ends"


def main(bin_dir, corpus):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = f"{tmp}/a"
        first = run(bin_dir, corpus, 2, "--steps", 10, "--save", ckpt, "--async-save")
        saved = first["digest"]["at_save"]
        loaded = run(bin_dir, corpus, 2, "--load", ckpt)
        assert loaded["resumed_step"] == ["10"] and loaded["digest"]["after_load"] == saved, \
            f"the asynchronous save does not load the state saved: {loaded} vs {saved}"

        sync = f"{tmp}/sync"
        run(bin_dir, corpus, 2, "--steps", 10, "--save", sync)
        from_async, from_sync = (run(bin_dir, corpus, 2, "--load", c, "--steps", 2) for c in (ckpt, sync))
        assert from_async["loss"] == from_sync["loss"] and from_async["digest"] == from_sync["digest"], \
            f"a resume from the async checkpoint differs from one from the sync one:\n{from_async}\n{from_sync}"

        kill_during_save(bin_dir, corpus, ckpt, "--async-save")
        assert not (Path(ckpt) / "step-00000012" / "metadata.json").exists()
        after_kill = run(bin_dir, corpus, 2, "--load", ckpt)
        assert after_kill["resumed_step"] == ["10"] and after_kill["digest"]["after_load"] == saved, \
            "the killed asynchronous save broke the previous checkpoint"
        phases = kills_at_random_moments(bin_dir, corpus, tmp)
        gpt_train_resumes_bitwise(bin_dir, corpus, tmp)
    print(f"kill -9 at {KILLS} random moments ({', '.join(phases)}): the last complete checkpoint loads bitwise")
    print("async checkpoint end to end: the background write loads bitwise; a kill -9 during it "
          "leaves the previous checkpoint loadable; gpt_train --async-save resumes bitwise")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
