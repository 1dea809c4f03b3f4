"""What prefetch and the rate limiter buy: gpt_train (W=2, FULL_SHARD) with each scheduling
variant, interleaved over rounds, same weights and batches. Writes bench/results/prefetch.md.

    .venv/bin/python bench/prefetch_ablation.py [--rounds 3] [--steps 8]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "build" / "bin"
VARIANTS = {
    "backward pre + forward, limit 2 (default)": [],
    "backward pre, limit 2": ["--no-forward-prefetch"],
    "backward post, limit 2": ["--no-forward-prefetch", "--backward-prefetch", "post"],
    "no prefetch, limit 2": ["--no-forward-prefetch", "--backward-prefetch", "none"],
    "backward pre + forward, no limit": ["--limit-all-gathers", "0"],
    "backward pre + forward, limit 3": ["--limit-all-gathers", "3"],
}


def run(variant_args, steps, data, metrics):
    model = ["--layers", "8", "--dim", "256", "--heads", "4", "--seq", "128", "--batch", "4"]
    subprocess.run([str(BIN / "fsdprun"), "--nproc-per-node", "2", str(BIN / "gpt_train"),
                    "--data", data, *model, "--steps", str(steps), "--lr", "1e-3",
                    "--metrics", metrics, *variant_args],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = [[json.loads(l) for l in Path(metrics.format(rank=r)).read_text().splitlines()] for r in (0, 1)]
    step_ms = [max(a["step_ms"], b["step_ms"]) for a, b in zip(*rows)][2:]  # 2 warm-up steps
    peak = max(r["mem_peak_bytes"] for rank in rows for r in rank[2:])
    return step_ms, peak, [r["loss"] for r in rows[0]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    data = subprocess.run([str(ROOT / ".venv/bin/python"), "-c", "import os; print(os.path.dirname(os.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    times = {name: [] for name in VARIANTS}
    peaks, losses = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            names = list(VARIANTS)
            names = names[round_ % len(names):] + names[:round_ % len(names)]  # rotate the order
            for name in names:
                step_ms, peak, loss = run(VARIANTS[name], args.steps, data, f"{tmp}/m-{{rank}}.jsonl")
                times[name] += step_ms
                peaks[name], losses[name] = peak, loss
                print(f"[ablation] round {round_ + 1}: {name}: median {statistics.median(step_ms):.0f} ms", flush=True)
    base = statistics.median(times["no prefetch, limit 2"])
    lines = ["# Prefetch and rate limiter (gpt_train, W=2, FULL_SHARD, 8 layers x 256, seq 128, batch 4)", "",
             f"{args.rounds} rounds x {args.steps - 2} timed steps per variant, interleaved; "
             "step time = slowest rank; peak = counting allocator, max over ranks.", "",
             "| variant | median ms/step | vs no prefetch | peak tensor MiB | losses equal to default |",
             "|---|---|---|---|---|"]
    default = losses["backward pre + forward, limit 2 (default)"]
    for name in VARIANTS:
        median = statistics.median(times[name])
        lines.append(f"| {name} | {median:.0f} | {median / base:.3f} | {peaks[name] / 2**20:.1f} | "
                     f"{'yes' if losses[name] == default else 'NO'} |")
    out = ROOT / "bench" / "results" / "prefetch.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
