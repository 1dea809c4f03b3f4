"""End to end: the planner as a user runs it, for a GPT and a Llama. gpt_train --plan --json
predicts a run's peak and bytes; the run (fsdprun, W=2) measures them; under a --max-memory-gb cap that the default run
exceeds, gpt_train --auto picks another configuration and trains within the cap on every rank at
every step, and prints the plan against the run; fsdp_plan searches; bad --auto flags fail clearly."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 1024 ** 3


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def plan(bin_dir, args, *flags):
    out = subprocess.run([f"{bin_dir}/gpt_train", *args, "--plan", "--json", "--ranks", "2",
                          "--ranks-per-host", "2", *flags], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def train(bin_dir, args, metrics, *flags):
    out = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train", *args,
                          "--metrics", metrics, *flags], check=True, capture_output=True, text=True)
    ranks = [read(metrics.format(rank=r)) for r in range(2)]
    return out.stdout, ranks


def main(bin_dir, corpus):
    args = ["--data", corpus, "--max-data-mb", "1", "--layers", "4", "--dim", "128", "--heads", "4",
            "--seq", "128", "--batch", "8", "--steps", "4", "--lr", "1e-3"]
    for label, model in (("GPT", []), ("Llama", ["--model", "llama", "--kv-heads", "2"])):
        out = plan_and_auto(bin_dir, args + model, label)
    shown = [line.split(": ", 1)[-1] for line in out.splitlines()]
    print("\n".join(line for line in shown if line.startswith(("  best", "  runner", "plan vs run"))))
    bad_flags(bin_dir, args)
    fsdp_plan(bin_dir)
    async_save_staging(bin_dir, corpus)


def plan_and_auto(bin_dir, args, label):
    """The default run's peak and bytes as planned; --auto under a cap the default exceeds."""
    default = plan(bin_dir, args)
    checkpointed = plan(bin_dir, args, "--activation-checkpointing")
    assert {"ranks", "traffic", "time", "peak_bytes", "fits"} <= set(default), default.keys()
    assert checkpointed["peak_bytes"] < default["peak_bytes"], (checkpointed["peak_bytes"], default["peak_bytes"])
    with tempfile.TemporaryDirectory() as tmp:
        _, ranks = train(bin_dir, args, f"{tmp}/d-{{rank}}.jsonl")
        measured = max(s["mem_peak_bytes"] for rank in ranks for s in rank[1:])
        ratio = measured / default["peak_bytes"]
        assert abs(ratio - 1) <= 0.10, f"default run: measured {measured}, planned {default['peak_bytes']}"
        for rank in ranks:
            for s in rank:
                assert s["bytes_all_gather"] == default["traffic"]["all_gather_bytes"], s
                assert s["bytes_reduce_scatter"] == default["traffic"]["reduce_scatter_bytes"], s
        # A cap the default run exceeds and activation checkpointing fits under.
        cap = (checkpointed["peak_bytes"] + default["peak_bytes"]) / 2
        assert measured > cap, (measured, cap)
        out, auto = train(bin_dir, args, f"{tmp}/a-{{rank}}.jsonl", "--auto", "--max-memory-gb", str(cap / GIB))
        assert "best:" in out and "plan vs run:" in out, out
        worst = max(s["mem_peak_bytes"] for rank in auto for s in rank)
        assert worst <= cap, f"--auto exceeded its cap: {worst} > {cap}"
        assert all(len(rank) == 4 for rank in auto), [len(rank) for rank in auto]
    print(f"{label} default: planned {default['peak_bytes']}, measured {measured} ({ratio:.3f}x); "
          f"cap {cap:.0f}: --auto peaked at {worst} ({worst / cap:.3f} of the cap)")
    return out


def async_save_staging(bin_dir, corpus):
    """--async-save: the staging arena (kept from the first save on) is in the planned peak, as in
    the run's; a model whose arena is a large share of the peak, so that leaving it out shows."""
    args = ["--data", corpus, "--max-data-mb", "1", "--layers", "4", "--dim", "256", "--heads", "4",
            "--seq", "32", "--batch", "1", "--steps", "5", "--lr", "1e-3"]
    with tempfile.TemporaryDirectory() as tmp:
        saving = ["--async-save", "--save-every", "1", "--checkpoint-dir", f"{tmp}/ck"]
        plain, planned = plan(bin_dir, args), plan(bin_dir, args, *saving)
        _, ranks = train(bin_dir, args, f"{tmp}/m-{{rank}}.jsonl", *saving)
        measured = max(s["mem_peak_bytes"] for rank in ranks for s in rank if s.get("step", 0) >= 2)
        ratio = measured / planned["peak_bytes"]
        assert abs(ratio - 1) <= 0.10, f"--async-save: measured {measured}, planned {planned['peak_bytes']}"
        staging = planned["ranks"][0]["staging_bytes"]
        assert planned["peak_bytes"] == plain["peak_bytes"] + staging and staging > 0.2 * planned["peak_bytes"], \
            (planned["peak_bytes"], plain["peak_bytes"], staging)
    print(f"--async-save: planned {planned['peak_bytes']} (staging {staging}), measured {measured} ({ratio:.3f}x)")


def bad_flags(bin_dir, args):
    r = subprocess.run([f"{bin_dir}/gpt_train", *args, "--auto"], capture_output=True, text=True)
    assert r.returncode == 2 and "--auto needs --max-memory-gb" in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", "2", f"{bin_dir}/gpt_train", *args,
                        "--auto", "--max-memory-gb", "0.001"], capture_output=True, text=True)
    assert r.returncode != 0 and "no configuration fits --max-memory-gb 0.001" in r.stdout + r.stderr, r.stderr


def fsdp_plan(bin_dir):
    """The command: a search under a cap names the best, the runner-up and the rejected."""
    gpt = ["--layers", "8", "--dim", "256", "--heads", "8", "--seq", "256", "--batch", "4",
           "--ranks", "16", "--ranks-per-host", "8", "--gpu", "a100-80gb"]
    one = json.loads(subprocess.run([f"{bin_dir}/fsdp_plan", *gpt, "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    assert one["world_size"] == 16 and one["shard_group_size"] == 16 and one["fits"], one
    search = json.loads(subprocess.run([f"{bin_dir}/fsdp_plan", *gpt, "--json", "--max-memory-gb", "0.15",
                                        "--batches", "1,4"], check=True, capture_output=True, text=True).stdout)
    assert search["fitting"] and search["rejected"], search.keys()
    assert all(p["peak_bytes"] <= 0.15 * GIB for p in search["fitting"])
    assert all(p["peak_bytes"] > 0.15 * GIB for p in search["rejected"])
    text = subprocess.run([f"{bin_dir}/fsdp_plan", *gpt, "--max-memory-gb", "0.15", "--batches", "1,4"],
                          check=True, capture_output=True, text=True).stdout
    assert "best:" in text and "runner-up:" in text and "no fit:" in text, text
    with tempfile.TemporaryDirectory() as tmp:  # any model: a description file, planned the same
        described = f"{tmp}/model.json"
        subprocess.run([f"{bin_dir}/fsdp_plan", *gpt, "--write-model-json", described], check=True,
                       capture_output=True)
        from_file = json.loads(subprocess.run([f"{bin_dir}/fsdp_plan", "--ranks", "16", "--ranks-per-host", "8",
                                               "--gpu", "a100-80gb", "--batch", "4", "--model-json", described,
                                               "--json"], check=True, capture_output=True, text=True).stdout)
        assert from_file["peak_bytes"] == one["peak_bytes"], (from_file["peak_bytes"], one["peak_bytes"])
        Path(described).write_text("{not json")
        r = subprocess.run([f"{bin_dir}/fsdp_plan", "--model-json", described, "--gpu", "h200"],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "not JSON" in r.stderr, r.stderr
    r = subprocess.run([f"{bin_dir}/fsdp_plan", *gpt, "--strategy", "hybrid", "--shard-group-size", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "does not divide the world size 16" in r.stderr, r.stderr
    print("fsdp_plan: plan, search, a model description file and bad input as expected")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
