"""The bubble of each pipeline schedule, measured against its formula (issue 60 item 8).

For each schedule and micro-batch count, `gpt_train --pp 2 --trace` records a step's actions
(src/pp/pipeline.cpp: every action a span; receives on the waits lane). A rank's idle fraction is
the time it spent waiting to receive over its step (first action's start to last action's end);
docs/pipeline-parallel.md gives the formula when every forward and backward of a stage takes the
same time and messages none: (P-1)/(M+P-1) for GPipe and 1F1B, (P-1)/(V·M+P-1) for interleaved
1F1B. Real stages differ (a backward is about twice a forward, the last stage holds the head), so
the measured fraction is the formula's order, not its value: both are written side by side.

    .venv/bin/python bench/pipeline_bubble.py [--out bench/results/pipeline-bubble.md]
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
MODEL = ["--model", "llama", "--kv-heads", "2", "--layers", "8", "--dim", "128", "--heads", "4", "--seq", "128",
         "--batch", "4", "--lr", "1e-3", "--seed", "1234", "--max-data-mb", "8", "--optimizer", "fused"]
P = 2
RUNS = [("gpipe", 1, 4), ("gpipe", 1, 8), ("1f1b", 1, 4), ("1f1b", 1, 8),
        ("interleaved-1f1b", 2, 4), ("interleaved-1f1b", 2, 8)]
TRACED_STEPS = 4  # gpt_train traces step min(2, steps - 1): steps 0-1 warm up


def formula(schedule, v, m, p=P):
    return (p - 1) / (v * m + p - 1)


def idle_fraction(trace_path):
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = [e for e in events if e.get("ph") == "X" and e["name"].startswith("pp ")]
    if not spans:
        raise SystemExit(f"{trace_path}: no pipeline span (a gpt_train without the pipeline's tracing?)")
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    waits = sum(e["dur"] for e in spans if e["name"].startswith("pp recv_"))
    return waits / (end - start), (end - start) / 1000.0


def measure(tmp, data, schedule, v, m):
    trace = os.path.join(tmp, f"{schedule}-{m}-rank{{rank}}.json")
    cmd = [os.path.join(BIN, "fsdprun"), "--nproc-per-node", str(P), os.path.join(BIN, "gpt_train"), *MODEL,
           "--data", data, "--steps", str(TRACED_STEPS), "--pp", str(P), "--pp-schedule", schedule,
           "--microbatches", str(m), "--trace", trace]
    if schedule == "interleaved-1f1b":
        cmd += ["--stages-per-rank", str(v)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
    return [idle_fraction(trace.format(rank=r)) for r in range(P)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline-bubble.md"))
    args = ap.parse_args()
    data = os.path.dirname(os.__file__)
    lines = ["# The bubble of each schedule, measured against its formula", "",
             f"`bench/pipeline_bubble.py`: gpt_train --pp {P}, a Llama of 8 blocks × 128 (seq 128, 4 rows "
             "per micro-batch), one traced step per run (step 2). Idle: the time a rank waits to receive, "
             "over its step. The formula assumes equal forward and backward times and free messages.", "",
             "| schedule | stages per rank | micro-batches | idle rank 0 | idle rank 1 | mean | formula | step ms |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="pp_bubble_") as tmp:
        for schedule, v, m in RUNS:
            ranks = measure(tmp, data, schedule, v, m)
            idle = [f for f, _ in ranks]
            lines.append(f"| {schedule} | {v} | {m} | {idle[0]:.3f} | {idle[1]:.3f} | {statistics.mean(idle):.3f} | "
                         f"{formula(schedule, v, m):.3f} | {max(ms for _, ms in ranks):.1f} |")
            print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
