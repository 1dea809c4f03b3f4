"""What the fused AdamW (gpt_train --optimizer fused, fsdp::optim::AdamW) gains over LibTorch's
loop (--optimizer torch) on this machine, and the same choice in PyTorch FSDP2 (AdamW(fused=True)
against its default foreach), measured side by side: every round runs the four in a rotating
order on the same weights and batches; step times are medians over the timed steps of all rounds.

    .venv/bin/python bench/optimizer_bench.py [--config small|medium] [--rounds 3] [--out DIR]

Writes DIR/optimizer-CONFIG.{json,md} (default bench/results). The ratio that matters is fused / loop
within each system, measured in one run (this machine is shared and noisy)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import run_bench as rb  # noqa: E402  (the benchmark's configurations and data)

WORLD = 2
KINDS = {  # name: (system, optimizer): gpt_train's --optimizer, or the peer's AdamW(fused=...)
    "cpp fused": ("cpp", "fused"),
    "cpp torch loop": ("cpp", "torch"),
    "fsdp2 fused": ("peer", "fused"),
    "fsdp2 foreach": ("peer", "foreach"),
}


def command(kind, c, d, data, metrics):
    system, optimizer = KINDS[kind]
    init, batches = os.path.join(d, "init.pt"), os.path.join(d, "batches.pt")
    if system == "cpp":
        return [rb.FSDPRUN, "--nproc-per-node", str(WORLD), rb.GPT_TRAIN,
                *rb.train_args(c, data, optimizer), "--init-from", init, "--metrics", metrics]
    return [os.path.join(rb.VENV, "torchrun"), "--standalone", "--nproc-per-node", str(WORLD),
            "--log-dir", os.path.join(d, "torchrun"), rb.PEER, *rb.model_args(c), "--batch", str(c["batch"]), "--steps", str(c["steps"]),
            "--lr", str(c["lr"]), "--init-from", init, "--metrics", metrics, "--batches", batches,
            *(["--fused"] if optimizer == "fused" else [])]


def step_times(path, warmup):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r["step_ms"] for r in records[warmup:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="small", choices=["small", "medium"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=rb.RESULTS)
    args = ap.parse_args()
    c = rb.CONFIGS[args.config]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    times = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="optimizer_bench_") as d:
        data = os.path.dirname(os.__file__)  # the Python standard library's sources, as make bench
        common = [*rb.model_args(c), "--seed", str(rb.SEED), "--data", data,
                  "--max-data-mb", str(rb.MAX_DATA_MB)]
        # The initial weights, and the global batches of gpt_train's runs for the peer.
        subprocess.run([rb.GPT_TRAIN, "--reference", *common, "--steps", "0", "--save-full",
                        os.path.join(d, "init.pt")], check=True, env=env, capture_output=True)
        subprocess.run([rb.GPT_TRAIN, "--reference", "--world-size", str(WORLD), *common,
                        "--batch", str(c["batch"]), "--steps", str(c["steps"]), "--lr", "0",
                        "--dump-batches", os.path.join(d, "batches.pt")],
                       check=True, env=env, capture_output=True)
        names = list(KINDS)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for kind in order:
                metrics = os.path.join(d, f"{kind.replace(' ', '_')}-r{r}-{{rank}}.jsonl")
                out = subprocess.run(command(kind, c, d, data, metrics), env=env, capture_output=True,
                                     text=True, timeout=1800)
                if out.returncode != 0:
                    sys.exit(f"{kind} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
                times[kind] += step_times(metrics.format(rank=0), c["warmup"])
                print(f"round {r + 1}: {kind}: median {statistics.median(times[kind]):.1f} ms", flush=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"config": args.config, "world": WORLD, "rounds": args.rounds, "median_step_ms": median,
              "cpp_fused_over_loop": median["cpp fused"] / median["cpp torch loop"],
              "fsdp2_fused_over_foreach": median["fsdp2 fused"] / median["fsdp2 foreach"],
              "cpp_fused_over_fsdp2_fused": median["cpp fused"] / median["fsdp2 fused"]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"optimizer-{args.config}.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# AdamW: fused kernel vs loop ({args.config}, W = {WORLD}, {args.rounds} rounds, "
             "interleaved)", "", "| run | median step ms |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in median.items()]
    lines += ["", f"- gpt_train fused / LibTorch loop: **{result['cpp_fused_over_loop']:.3f}**",
              f"- FSDP2 fused / foreach: {result['fsdp2_fused_over_foreach']:.3f}",
              f"- gpt_train fused / FSDP2 fused: {result['cpp_fused_over_fsdp2_fused']:.3f}",
              "", f"Command: `.venv/bin/python bench/optimizer_bench.py --config {args.config} "
              f"--rounds {args.rounds}`"]
    with open(os.path.join(args.out, f"optimizer-{args.config}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
