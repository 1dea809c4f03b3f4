"""What a save costs training, synchronous against asynchronous, side by side in one run.

checkpoint_tool under fsdprun (W ranks) trains a GPT with AdamW and saves twice, one step apart,
each save followed by --steps-after-save steps before its wait(); rounds alternate, and each
number is the median over rounds:
  - stall: the step boundary's wait for the save call (sync: the whole save; async: the
    staging). The first save of a process also maps its staging arena; the second one reuses it
    (the steady state of a run saving every N steps), both reported; and the first save of a
    process that reserved its arena after its first step (--reserve-arena, as gpt_train does).
  - steps during the background write against steps with no save (the first two steps left out).
  - recovery: a new run (W ranks) loading the async checkpoint (the page cache warm).
  - peak memory over an async save (wait() at once), for the default budget (one rank's shards)
    and a smaller one (waves): fsdp::memory_stats()'s counted peak and the RSS high-water mark
    (VmHWM), both over the save's start, against the budget; and the most file descriptors open
    at once during the save, over the start's (/proc/self/fd every ms); each the most over
    rounds. Waves are whole shard files, so the smaller budget is the smallest one the layout
    allows: its largest file (what the save refuses a 1-byte budget with).

  .venv/bin/python bench/checkpoint/async_stall.py [--world 2] [--layers 8] [--dim 512] [--rounds 5]

Writes bench/results/async-checkpoint.md and .json (--out for the .md; the .json beside it).
"""
import argparse
import json
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from run import ROOT

STEPS, AFTER = 6, 6


def tool(bin_dir, world, model, *args):
    out = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", str(world), f"{bin_dir}/checkpoint_tool",
                          "--data", str(ROOT / "build" / "test-corpus"), "--batch", "1", "--seq", "32", *model,
                          *map(str, args)], check=True, capture_output=True, text=True).stdout
    lines = {}
    for line in out.splitlines():
        words = line.split(": ", 1)[-1].split()
        if words:
            lines.setdefault(words[0], []).append(words[1:])
    return lines


def step_times(lines, writing):
    return [float(s) for step, s, w in lines["step_seconds"] if int(step) >= 2 and int(w) == writing]


def smallest_budget(bin_dir, world, model, tmp):
    """The smallest budget a rank's shard files allow (the largest file): what the save refuses
    a 1-byte budget with."""
    refused = subprocess.run([f"{bin_dir}/fsdprun", "--nproc-per-node", str(world), f"{bin_dir}/checkpoint_tool",
                              "--data", str(ROOT / "build" / "test-corpus"), "--batch", "1", "--seq", "32", *model,
                              "--steps", "1", "--save", tmp, "--async-save", "--staging-budget", "1"],
                             capture_output=True, text=True)
    return max(int(n) for n in re.findall(r"to at least (\d+)", refused.stdout + refused.stderr))


def probe(bin_dir, world, model, tmp, budget):
    r = tool(bin_dir, world, model, "--steps", 2, "--save", tmp, "--async-save", "--probe", "--staging-budget",
             budget)
    counted, rss = map(int, r["save_memory"][0])
    return {"counted": counted, "rss": rss, "fds": int(r["save_fds"][0][0]),
            "waves": int(r["stall_seconds"][0][1])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "async-checkpoint.md"))
    args = parser.parse_args()
    model = ["--layers", str(args.layers), "--dim", str(args.dim), "--heads", "8"]
    train = ["--steps", STEPS, "--saves", 2, "--steps-after-save", AFTER]
    m = {k: [] for k in ("sync", "async_first", "reserved_first", "async", "async_total", "no_save", "writing", "sync_steps", "load")}
    probes = {"full": [], "small": []}
    small = None
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            sync = tool(args.bin, args.world, model, *train, "--save", f"{tmp}/sync")
            m["sync"].append(float(sync["stall_seconds"][-1][0]))
            m["sync_steps"] += step_times(sync, 0)
            saved = tool(args.bin, args.world, model, *train, "--save", f"{tmp}/async", "--async-save")
            m["async_first"].append(float(saved["stall_seconds"][0][0]))
            m["async"].append(float(saved["stall_seconds"][-1][0]))
            m["no_save"] += step_times(saved, 0)
            reserved = tool(args.bin, args.world, model, *train, "--save", f"{tmp}/reserved", "--async-save",
                            "--reserve-arena")
            assert reserved["reused_arena"][0] == ["1"], "the first save did not stage in the reserved arena"
            m["reserved_first"].append(float(reserved["stall_seconds"][0][0]))
            m["writing"] += step_times(saved, 1)
            nbytes = int(saved["save_seconds"][-1][1])
            m["load"].append(float(tool(args.bin, args.world, model, "--load", f"{tmp}/async")["load_seconds"][0][0]))
            small = small or smallest_budget(args.bin, args.world, model, f"{tmp}/refused")
            probes["full"].append(probe(args.bin, args.world, model, f"{tmp}/full", 0))
            probes["small"].append(probe(args.bin, args.world, model, f"{tmp}/small", small))
    med = statistics.median
    r = {k: med(v) for k, v in m.items() if v}
    r["writing_steps"] = len(m["writing"])
    rank_bytes = nbytes / args.world
    budgets = {"full": rank_bytes, "small": small}
    # Memory and descriptors: the most over the rounds (a bound, not a typical value; the RSS
    # high-water of some rounds barely moves, where the arena reuses pages the process freed).
    mem = {name: {k: max(p[k] for p in ps) for k in ("counted", "rss", "fds", "waves")} for name, ps in probes.items()}
    rows = [
        "# Asynchronous checkpoints: what a save costs training (bench/checkpoint/async_stall.py)",
        "",
        f"GPT {args.layers} layers x {args.dim}, W={args.world}, {nbytes / 1e6:.1f} MB a checkpoint "
        f"({rank_bytes / 1e6:.1f} MB of shards a rank), AdamW, CPU ranks, the machine's own disk; medians of "
        f"{args.rounds} interleaved rounds (sync run, async run, async run with a reserved arena, two probe runs).",
        "",
        "| | seconds | ratio |",
        "|---|---|---|",
        f"| sync save: the step boundary stalls | {r['sync']:.4f} | 1 |",
        f"| async save, the process's first (maps the arena) | {r['async_first']:.4f} | "
        f"{r['async_first'] / r['sync']:.3f} of sync |",
        f"| async save, the process's first, its arena reserved after step 1 (reserve_staging_arena) | "
        f"{r['reserved_first']:.4f} | {r['reserved_first'] / r['sync']:.3f} of sync |",
        f"| async save, a later one (the arena reused) | {r['async']:.4f} | {r['async'] / r['sync']:.3f} of sync |",
        f"| a step with no save | {r['no_save']:.4f} | 1 |",
        f"| a step during the background write ({r['writing_steps']} steps) | {r.get('writing', float('nan')):.4f} | "
        f"{r.get('writing', float('nan')) / r['no_save']:.3f} of no save |",
        f"| recovery: a new run loads the async checkpoint (page cache warm) | {r['load']:.4f} | "
        f"{r['load'] / r['sync']:.3f} of a sync save |",
        "",
        "| async save's budget | waves | counted peak (memory_stats), most over rounds | RSS high-water, most | "
        "fds open at once, most |",
        "|---|---|---|---|---|",
    ]
    for name, p in mem.items():
        b = budgets[name]
        rows.append(f"| {b / 1e6:.1f} MB ({'one rank' if name == 'full' else 'the largest file'}) | {p['waves']:.0f} | "
                    f"{p['counted'] / 1e6:.1f} MB ({p['counted'] / b:.3f} of budget) | {p['rss'] / 1e6:.1f} MB "
                    f"({p['rss'] / b:.3f}) | +{p['fds']:.0f} |")
    rows.append("")
    Path(args.out).write_text("\n".join(rows))
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"args": vars(args), "medians": r, "memory": mem, "budgets": budgets, "raw": m, "probes": probes}, indent=1))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
